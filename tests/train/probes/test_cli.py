"""`python -m train probe --help` lists the tasks and every key=value option with its default
(read from the code), `probe TASK --help` prints that task's options, and a reference method
that is not run is refused before anything trains; with only the reference method run, one
line says that no p-values can be computed."""

import dataclasses

import numpy as np
import pytest

from train.cli.entry import main
from train.probes import runner
from train.probes.runner import ProbeConfig
from train.probes.tasks import TASKS, task_sizes


def help_text(capsys, argv):
    """The help `main(argv)` prints; it exits 0 (argparse's --help raises SystemExit(0))."""
    try:
        code = main(argv)
    except SystemExit as exit_info:
        code = exit_info.code
    assert code == 0
    captured = capsys.readouterr()
    assert "error" not in captured.err
    return " ".join(captured.out.split())


def test_probe_help_lists_tasks_and_options_with_their_defaults(capsys):
    text = help_text(capsys, ["probe", "--help"])
    for task in TASKS:
        assert task in text
    for field in dataclasses.fields(ProbeConfig):
        assert f"{field.name}={field.default}" in text, field.name
    assert "methods=fpa,fox" in text and "reference=fpa" in text and "out=" in text
    assert "fpa_stack" in text                  # the methods
    assert "probe TASK --help" in text


@pytest.mark.parametrize("task", ["two_walks", "flip_flop"])
def test_probe_task_help_prints_the_tasks_options(capsys, task):
    text = help_text(capsys, ["probe", task, "--help"])
    for key, default in task_sizes(task).items():
        assert f"{key}=" in text and (default is None or f"{key}={default}" in text), key
    assert f"threshold {TASKS[task].threshold}" in text
    config = {**{f.name: f.default for f in dataclasses.fields(ProbeConfig)}, **TASKS[task].config}
    for key, value in config.items():
        assert f"{key}={value}" in text, key
    assert "ladder" not in text


def test_probe_task_help_also_after_options(capsys):
    text = help_text(capsys, ["probe", "two_walks", "seeds=2", "-h"])
    assert "num_events=2" in text


def test_a_reference_that_is_not_run_is_refused_before_training(capsys, monkeypatch):
    def no_training(*args, **kwargs):
        raise AssertionError("trained although the reference method is not run")

    monkeypatch.setattr(runner, "train_seeds", no_training)
    assert main(["probe", "two_walks", "reference=fox", "methods=fpa"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert "reference=fox" in err[0] and "p-value" in err[0] and "methods" in err[0]


def test_only_the_reference_run_says_no_p_values(capsys, monkeypatch, tmp_path):
    def train_seeds(method, task, sizes, config):
        accuracy = np.ones((config.seeds, 1), np.float32)
        return {"seeds": list(range(config.seeds)), "loss": np.zeros_like(accuracy),
                "accuracy": accuracy, "seconds": 0.0}

    monkeypatch.setattr(runner, "train_seeds", train_seeds)
    assert main(["probe", "copy", "methods=fpa", "seeds=2", "steps=1", "eval_every=1",
                 f"out={tmp_path}"]) == 0
    out = capsys.readouterr().out.splitlines()
    notes = [line for line in out if "p-value" in line]
    assert len(notes) == 1 and "only the reference" in notes[0], out


def test_the_default_reference_is_fpa_if_run_else_the_first_method():
    from train.probes.cli import parse_arguments

    assert parse_arguments(["ladder"])[2] == "fpa"
    assert parse_arguments(["ladder", "methods=fox,fpa"])[2] == "fpa"
    assert parse_arguments(["ladder", "methods=fox,softmax_rope"])[2] == "fox"
    with pytest.raises(ValueError, match="reference=dcp is not among methods=fox,fpa"):
        parse_arguments(["ladder", "methods=fox,fpa", "reference=dcp"])
