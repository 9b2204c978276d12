"""`eval --suite long` keeps the results of different settings apart: the default output
directory is one per setting (tasks, lengths, non-default depths / samples / batches), and an
--out that already holds long-eval files has them replaced (a `note:` line says so), so no
heatmap of an earlier run's tasks stays beside a JSON that lacks them. While it works it prints
one progress line per task and length on stderr."""

import json

import pytest

from tests.train.tiny_run import copy_run
from train.experiments.long_eval_tasks import TASKS

# passkey fits in 110 byte tokens, the multi-needle tasks do not (their cells are "-"): cheap
SETTING = ["--suite", "long", "--lengths", "110,120", "--depths", "0", "--samples", "1",
           "--batches", "1"]


@pytest.fixture(scope="module")
def run_dir(tiny_trained_run, tmp_path_factory):
    """A copy of the session's tiny run: the default output directories are written into it."""
    return copy_run(tiny_trained_run, tmp_path_factory.mktemp("long_settings") / "run")


def outputs(directory):
    """(tasks in long_eval.json, tasks with a heatmap PNG) of a long-eval directory."""
    result = json.loads((directory / "long_eval.json").read_text())
    pngs = {p.name[len("long_eval_"):-len(".png")] for p in directory.glob("long_eval_*.png")}
    return {t for t in TASKS if t in result}, pngs - {"position_loss"}


@pytest.mark.slow
def test_each_setting_gets_its_own_directory_and_progress_lines(run_dir, capsys):
    from train.cli.entry import main

    capsys.readouterr()
    assert main(["eval", str(run_dir), *SETTING]) == 0
    err = capsys.readouterr().err.splitlines()
    cells = [line for line in err if line.startswith("long eval ") and " tokens: " in line]
    assert len(cells) == len(TASKS) * 2, err                      # one per task and length
    assert cells[0].startswith(f"long eval 1/{2 * len(TASKS)}: passkey at 110 tokens")
    assert any("per-position held-out loss at 64 tokens" in line for line in err), err

    assert main(["eval", str(run_dir), *SETTING, "--tasks", "passkey"]) == 0
    every = run_dir / "long-eval-step2-all-len110,120-depths0-samples1-batches1"
    passkey = run_dir / "long-eval-step2-passkey-len110,120-depths0-samples1-batches1"
    assert outputs(every) == (set(TASKS), set(TASKS))
    assert outputs(passkey) == ({"passkey"}, {"passkey"})
    assert "written: " + str(passkey) in capsys.readouterr().out


@pytest.mark.slow
def test_an_out_directory_of_another_setting_keeps_none_of_its_files(run_dir, tmp_path,
                                                                     capsys):
    from train.cli.entry import main

    out = tmp_path / "long"
    assert main(["eval", str(run_dir), *SETTING, "--out", str(out)]) == 0
    assert outputs(out) == (set(TASKS), set(TASKS))
    capsys.readouterr()
    assert main(["eval", str(run_dir), *SETTING, "--tasks", "passkey", "--out", str(out)]) == 0
    assert outputs(out) == ({"passkey"}, {"passkey"})
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and str(out) in notes[0] and "replaced" in notes[0], notes
