"""`python -m train probe` says what it is doing on stderr: a line before and after each
method."""


import numpy as np


def stderr_lines(capsys):
    return capsys.readouterr().err.splitlines()


def test_probe_prints_a_line_before_and_after_each_method(monkeypatch, tmp_path, capsys):
    from train.cli.entry import main
    from train.probes import runner

    def train_seeds(method, task, sizes, config):    # the training itself is not under test
        accuracy = np.full((config.seeds, 2), 0.5 if method == "fox" else 1.0, np.float32)
        return {"seeds": list(range(config.seeds)), "loss": np.zeros_like(accuracy),
                "accuracy": accuracy, "seconds": 0.25}

    monkeypatch.setattr(runner, "train_seeds", train_seeds)
    assert main(["probe", "ladder", "methods=fpa,fox", "seeds=3", "steps=2", "eval_every=1",
                 f"out={tmp_path / 'probe'}"]) == 0
    lines = [line for line in stderr_lines(capsys) if line.startswith("probe ladder")]
    assert len(lines) == 4, lines
    assert lines[0].startswith("probe ladder 1/2: training fpa on 3 seeds")
    assert "2 steps" in lines[0]
    assert lines[1].startswith("probe ladder 1/2: fpa: 3/3 seeds above 0.95")
    assert lines[2].startswith("probe ladder 2/2: training fox")
    assert lines[3].startswith("probe ladder 2/2: fox: 0/3 seeds above 0.95")
