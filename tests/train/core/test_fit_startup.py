"""A run's start (train/core/fit.py): the startup lines, the run record, and resuming."""

import json

import pytest

from tests.seeds import case_seed
from tests.train import tiny_run
from tests.train.tensorboard_events import tensorboard_scalars
from train.cli.entry import main
from train.core.metrics import METRICS_FILE
from train.core.presets import load_config


TINY = tiny_run.TINY


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return tiny_run.write_corpus(tmp_path_factory.mktemp("corpus"), seed=case_seed(1200))


def test_run_startup_record_and_resume(tmp_path, corpus, capsys):
    run_dir = tmp_path / "run"
    argv = ["fit", "tiny_softmax", *TINY, f"data.source={corpus}", "train.checkpoint_every=2"]
    assert main([*argv, "train.steps=4", "--run-dir", str(run_dir)]) == 0
    captured = capsys.readouterr()
    out = captured.out.splitlines()
    assert out[0] == f"new run in {run_dir}"
    assert out[1].startswith("config: preset tiny_softmax with ") and "data.seq_len=16" in out[1]
    err = captured.err
    for expected in ("initial state drawn in ", "(train.init_on=host)", "devices: 1 x ", "mesh data=1 fsdp=1 tensor=1", "M parameters",
                     "tokens/step: 2 x 16 = 32", "memory estimate: ", f"run dir: {run_dir}",
                     "compile cache: ", "compiling the train step...",
                     "compiled; first step done in"):
        assert expected in err, expected
    assert err.index("run dir:") < err.index("compiling") < err.index("step 1/4")

    from train.checkpoint.manager import Checkpointer
    from train.checkpoint.run_files import code_revision
    with Checkpointer(run_dir / "checkpoints", read_only=True) as checkpointer:
        record = checkpointer._manager.restore(4, args=__import__(
            "orbax.checkpoint").checkpoint.args.Composite(
                record=__import__("orbax.checkpoint").checkpoint.args.JsonRestore()))["record"]
    assert record["command_line"] == __import__("sys").argv
    assert record["code"] == code_revision() and len(record["code"]["commit"]) == 40
    assert record["config"] == load_config(
        "tiny_softmax", [*TINY, f"data.source={corpus}", "train.checkpoint_every=2",
                         "train.steps=4"]).to_dict()

    # a crash after step 4 was logged but before checkpoint 4 committed: the resumed run
    # replays steps 3 and 4 and metrics.jsonl holds each step once
    import shutil
    shutil.rmtree(run_dir / "checkpoints" / "4")
    assert main([*argv, "train.steps=5", "optim.lr=2e-3", "--run-dir", str(run_dir)]) == 0
    err = capsys.readouterr().err
    assert "warning: the config differs from the checkpoint's in optim.lr: 0.003 -> 0.002; " \
           "train.steps: 4 -> 5" in err
    raw = [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]
    train_steps = [r["step"] for r in raw if r["kind"] == "train"]
    assert train_steps == [1, 2, 3, 4, 5]
    (events,) = tensorboard_scalars(run_dir / "tensorboard")
    assert sorted(s for tag, s in events if tag == "train/loss") == [1, 2, 3, 4, 5]


def test_wall_time_counts_from_the_start_of_setup(tmp_path, corpus, monkeypatch):
    """FitResult.wall_seconds spans the whole run: setup before the initial state included."""
    import time

    import train.core.fit
    from train.core.fit import fit

    original = train.core.fit.build_session

    def slow_build_session(*args, **kwargs):
        time.sleep(0.5)
        return original(*args, **kwargs)

    monkeypatch.setattr(train.core.fit, "build_session", slow_build_session)
    config = load_config("tiny_softmax", [*TINY, f"data.source={corpus}", "train.steps=2"])
    started = time.time()
    wall = fit(config, tmp_path / "run").wall_seconds
    assert wall > time.time() - started - 0.25        # the 0.5 s in setup is counted
