"""Damaged runs through the command line: unreadable checkpoints and a damaged config.json are
one `error:` line on stderr and exit 1, with no traceback, not even at interpreter exit.

The checkpoint cases run `python -m train` as a subprocess: a failed Orbax read must not leave
tensorstore reads running on a closed event loop, which would print "RuntimeError: Event loop
is closed" tracebacks (or "Task exception was never retrieved") from other threads and at
exit, after main() had already returned. The config.json cases fail before JAX does any work, so
they call main() in-process.
"""

import shutil
import subprocess
import sys

import pytest

from tests.train import tiny_run
from train.cli.entry import main
from train.core.runs import checkpoint_dir, checkpoint_steps

TINY = [*tiny_run.TINY, "train.tensorboard=false"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished 4-step run with checkpoints at steps 2 and 4 (and its fit command line)."""
    root = tmp_path_factory.mktemp("unreadable")
    corpus = root / "corpus"
    corpus.mkdir()
    tiny_run.write_corpus(corpus, seed=7, documents=8)
    run_dir = root / "run"
    fit = ["fit", "tiny_softmax", *TINY, f"data.source={corpus}", "train.steps=4",
           "train.checkpoint_every=2", "--run-dir"]
    assert main([*fit, str(run_dir)]) == 0
    assert checkpoint_steps(run_dir) == [2, 4]
    return run_dir, fit


def _copy_with_emptied_steps(run_dir, target, steps):
    """A copy of the run whose `steps` have every array data file emptied (a full disk or an
    interrupted copy): the metadata reads, the arrays do not."""
    shutil.copytree(run_dir, target)
    for step in steps:
        data_files = [p for p in (checkpoint_dir(target) / str(step) / "state").rglob("*")
                      if p.is_file() and p.parent.name == "d"]
        assert data_files
        for path in data_files:
            path.write_bytes(b"")
    return target


def _cli(environment, cwd, *args):
    return subprocess.run([sys.executable, "-m", "train", *map(str, args)], cwd=cwd,
                          env=environment, capture_output=True, text=True, timeout=300)


def _one_error_line(result) -> str:
    lines = result.stderr.splitlines()
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith("error: ") and len(lines[0]) < 300, lines[0]
    return lines[0]


@pytest.mark.slow
def test_unreadable_checkpoints_are_one_error_line(trained, environment, tmp_path):
    run_dir, _ = trained
    newest_damaged = _copy_with_emptied_steps(run_dir, tmp_path / "newest", [4])
    all_damaged = _copy_with_emptied_steps(run_dir, tmp_path / "all", [2, 4])

    line = _one_error_line(_cli(environment, tmp_path, "eval", newest_damaged, "--step", 4,
                                "--batches", 1))
    assert f"{newest_damaged}: checkpoint step 4 is unreadable" in line
    assert line.endswith("OUT_OF_RANGE reading state")          # not orbax's tensorstore spec

    fallback = _cli(environment, tmp_path, "eval", newest_damaged, "--batches", 1)
    assert fallback.returncode == 0, fallback.stderr[-3000:]
    assert fallback.stdout.startswith(f"evaluated step 2 of {newest_damaged}")
    [warning] = fallback.stderr.splitlines()          # one line, no traceback after it
    assert "step 4 is unreadable (OUT_OF_RANGE reading state)" in warning
    assert "restored step 2 instead" in warning

    line = _one_error_line(_cli(environment, tmp_path, "eval", all_damaged, "--batches", 1))
    assert f"no readable checkpoint in {checkpoint_dir(all_damaged)}: steps 4, 2 are " \
           "unreadable (OUT_OF_RANGE reading state)" in line

    line = _one_error_line(_cli(environment, tmp_path, "generate", all_damaged, "--prompt", "x",
                                "--max-new-tokens", 2))
    assert "no readable checkpoint" in line and "steps 4, 2 are unreadable" in line
    line = _one_error_line(_cli(environment, tmp_path, "generate", newest_damaged, "--step", 4,
                                "--prompt", "x", "--max-new-tokens", 2))
    assert "checkpoint step 4 is unreadable" in line and "OUT_OF_RANGE reading state" in line
    assert sorted(p.name for p in checkpoint_dir(newest_damaged).iterdir()) == ["2", "4"]


def test_resuming_a_run_without_readable_checkpoints_is_one_error_line(trained, tmp_path,
                                                                        capsys):
    run_dir, fit = trained
    all_damaged = _copy_with_emptied_steps(run_dir, tmp_path / "all", [2, 4])
    capsys.readouterr()
    assert main([*fit, str(all_damaged)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: no readable checkpoint in"), err
    assert "steps 4, 2 are unreadable (OUT_OF_RANGE reading state" in err[0]
    assert checkpoint_steps(all_damaged) == [2, 4]             # nothing quarantined


@pytest.mark.parametrize("content", ["{bad", "[1, 2]", b"\xff\xfe{"])
def test_damaged_config_json_is_one_error_line_naming_it(trained, tmp_path, capsys, content):
    run_dir, fit = trained
    damaged = tmp_path / "run"
    shutil.copytree(run_dir, damaged)
    config_path = damaged / "config.json"
    if isinstance(content, bytes):
        config_path.write_bytes(content)
    else:
        config_path.write_text(content)
    commands = [
        ["eval", str(damaged)],
        ["generate", str(damaged), "--prompt", "x"],
        ["export", str(damaged), "--out", str(tmp_path / "export")],
        ["spectra", str(damaged)],
        ["cpt", "tiny_softmax", *TINY, f"cpt.reference={damaged}", "--run-dir",
         str(tmp_path / "cpt")],
        [*fit, str(damaged)],
    ]
    capsys.readouterr()
    for argv in commands:
        assert main(argv) == 1, argv
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: {config_path} is not "), (argv, err)
        assert ("valid JSON" if content != "[1, 2]" else "a JSON object") in err[0]
