"""`python -m train config` (train/cli/config.py)."""


from train.cli.entry import main
from train.core.presets import load_config


def test_config_command_prints_the_resolved_config(capsys):
    import yaml

    assert main(["config", "tiny_softmax", "optim.lr=2e-3", "train.grad_accum=2"]) == 0
    out = capsys.readouterr().out
    printed = yaml.safe_load(out)
    assert printed == load_config("tiny_softmax", ["optim.lr=2e-3",
                                                   "train.grad_accum=2"]).to_dict()
    assert out.splitlines()[-1] == ("# config: preset tiny_softmax with optim.lr=0.002, "
                                    "train.grad_accum=2")
    assert main(["config", "tiny_softmax", "train.grad_accum=3"]) == 2   # 8 rows, 3 parts
    assert "train.grad_accum" in capsys.readouterr().err
