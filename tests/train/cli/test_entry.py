"""The command line (train/cli/entry.py and the commands): one-line user errors, exit codes,
the default run directory, the run lock, divergence, read-only eval.

In-process `main([...])` except where a real signal and exit code are the point (one
subprocess test). Every fit here is a 1-layer width-16 model on a small corpus.
"""

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import train.core.session
from tests.train import tiny_run
from tests.train.overflowing_update import overflow_parameters_after
from train.cli import EXIT_DIVERGED, EXIT_PREEMPTED
from train.cli.entry import main
from train.core.metrics import read_metrics
from train.core.presets import load_config
from train.core.runs import (RunLockedError, checkpoint_dir, checkpoint_steps, claimed_run_dir,
                             default_run_dir, restore_run_state, run_lock)

REPO = Path(__file__).resolve().parents[3]
TINY = [*tiny_run.TINY, "train.tensorboard=false"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return tiny_run.write_corpus(tmp_path_factory.mktemp("corpus"), seed=11)


def overrides(corpus, *more):
    return [*TINY, f"data.source={corpus}", *more]


def error_line(capsys, after_progress: bool = False) -> str:
    """The one `error:` line on stderr (after the progress lines of a run that started)."""
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err), err
    if after_progress:
        err = err[-1:]
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


# ------------------------------------------------------------------ one-line user errors

def test_user_mistakes_are_one_line_errors_and_leave_no_run_dir(tmp_path, corpus, capsys):
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("model: [unclosed\n")
    assert main(["fit", str(bad_yaml), "--run-dir", str(tmp_path / "r0")]) == 2
    assert "malformed YAML" in error_line(capsys)
    assert not (tmp_path / "r0").exists()

    run_dir = tmp_path / "r1"
    assert main(["fit", "tiny_softmax", *overrides(tmp_path / "missing"),
                 "--run-dir", str(run_dir)]) == 1
    assert "does not exist" in error_line(capsys)
    assert not run_dir.exists()                     # failed before its first step: removed

    (tmp_path / "empty_corpus").mkdir()
    assert main(["fit", "tiny_softmax", *overrides(tmp_path / "empty_corpus"),
                 "--run-dir", str(run_dir)]) == 1
    assert "no non-empty documents" in error_line(capsys)
    assert not run_dir.exists()

    assert main(["eval", str(tmp_path / "nowhere")]) == 1
    assert "does not exist" in error_line(capsys)
    (tmp_path / "empty_run").mkdir()
    assert main(["eval", str(tmp_path / "empty_run")]) == 1
    error_line(capsys)

    for argv in (["eval", str(tmp_path), "--seq-len", "0"], ["eval", str(tmp_path), "--batches", "0"],
                 ["bench", "tiny_softmax", "--context", "0"]):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: python -m train "), err
        assert "expected an integer >= 1, got 0" in err[0]


def test_data_tokenizer_run_dir_and_prepare_mistakes_are_one_line_errors(tmp_path, corpus, capsys):
    run_dir = tmp_path / "run"
    for source, expected in ((f"arrayrecord:{tmp_path / 'no_shards'}", "does not exist"),
                             (f"{tmp_path / 'nowhere'}/*.py", "no file matches")):
        assert main(["fit", "tiny_softmax", *overrides(corpus, f"data.source={source}"),
                     "--run-dir", str(run_dir)]) == 1
        assert expected in error_line(capsys) and not run_dir.exists()
    assert main(["fit", "tiny_softmax", *overrides(corpus, f"data.tokenizer={tmp_path / 'tok'}"),
                 "--run-dir", str(run_dir)]) == 1
    assert f"tokenizer '{tmp_path / 'tok'}' does not exist" in error_line(capsys)
    assert not run_dir.exists()
    (tmp_path / "a_file").write_text("x")
    assert main(["fit", "tiny_softmax", *overrides(corpus), "--run-dir",
                 str(tmp_path / "a_file")]) == 1
    assert "is a file, expected a directory" in error_line(capsys)
    assert main(["eval", str(corpus)]) == 1                 # a directory that is not a run
    assert f"{corpus}: not a run directory (no config.json)" in error_line(capsys)

    shards = tmp_path / "shards"
    assert main(["prepare", "--source", str(tmp_path / "empty_source"), "--out", str(shards)]) == 1
    assert "does not exist" in error_line(capsys)
    assert main(["prepare", "--source", str(corpus), "--out", str(tmp_path / "a_file")]) == 1
    assert "is a file" in error_line(capsys)
    assert main(["prepare", "--source", str(corpus), "--out", str(shards), "--vocab-size", "5"]) == 1
    assert "vocab_size" in error_line(capsys)
    assert main(["prepare", "--source", str(corpus), "--out", str(shards), "--num-shards", "99"]) == 1
    assert "exceeds" in error_line(capsys) and not (shards / "manifest.json").exists()
    assert main(["prepare", "--source", str(corpus), "--out", str(shards), "--num-shards", "2"]) == 0
    assert main(["prepare", "--source", str(corpus), "--out", str(shards)]) == 1
    assert "already holds shards" in error_line(capsys)
    (shards / "manifest.json").write_text("{")
    assert main(["fit", "tiny_softmax", *overrides(corpus, f"data.source=arrayrecord:{shards}"),
                 "--run-dir", str(run_dir)]) == 1
    assert f"{shards / 'manifest.json'} is not valid JSON" in error_line(capsys)
    for argv in (["prepare", "--out", str(shards), "--num-shards", "0"],
                 ["prepare", "--out", str(shards), "--max-documents", "0"],
                 ["prepare", "--out", str(shards), "--vocab-size", "-1"],
                 ["bench", "tiny_softmax", "--warmup", "-1"]):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2 and "expected an integer >=" in capsys.readouterr().err


def test_a_genuine_bug_keeps_its_traceback_and_v_shows_user_errors(monkeypatch, tmp_path,
                                                                    capsys):
    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr("train.core.fit.fit", broken)
    with pytest.raises(ZeroDivisionError):
        main(["fit", "tiny_softmax", "--run-dir", str(tmp_path / "r")])
    assert main(["-v", "eval", str(tmp_path / "nowhere")]) == 1    # -v: the traceback first
    err = capsys.readouterr().err
    assert "Traceback" in err
    assert err.strip().splitlines()[-1].startswith("error: ") and "does not exist" in err


def test_verbose_keeps_the_exit_codes_and_overrides_may_follow_options(
        tmp_path, corpus, capsys, nan_at_step_3):
    assert main(["-v", "config", "tiny_softmax", "model.nonsense=1"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("error: unknown config")
    argv = ["-v", "fit", "tiny_softmax", "--run-dir", str(tmp_path / "r"),   # overrides last
            *overrides(corpus, "train.steps=6", "train.checkpoint_every=2")]
    assert main(argv) == EXIT_DIVERGED
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: training diverged")
    with pytest.raises(SystemExit) as exited:
        main(["config", "tiny_softmax", "--run-dir", "x"])         # config takes no --run-dir
    assert exited.value.code == 2 and "unrecognized arguments: --run-dir x" in \
        capsys.readouterr().err


def test_a_bugs_value_error_while_setting_up_a_run_keeps_its_traceback(
        monkeypatch, tmp_path, corpus):
    """A ValueError that no input check raised (here numpy's broadcasting error inside the
    session build) is a bug: its traceback, not a one-line `error:`."""
    def broken_session(*args, **kwargs):
        return np.zeros(3) + np.zeros(4)

    monkeypatch.setattr("train.core.fit.build_session", broken_session)
    with pytest.raises(ValueError, match="broadcast"):
        main(["fit", "tiny_softmax", *overrides(corpus, "train.steps=2"),
              "--run-dir", str(tmp_path / "r")])
    assert not (tmp_path / "r").exists()


# ------------------------------------------------------------------ default run directory, lock

def test_default_run_dir_is_derived_from_the_config_and_new_starts_another(tmp_path):
    preset = load_config("tiny_softmax", [])
    assert default_run_dir("tiny_softmax", preset, runs_dir=tmp_path) == tmp_path / "tiny_softmax"
    a = load_config("tiny_softmax", ["optim.lr=1e-3", "train.steps=70"])
    b = load_config("tiny_softmax", ["train.steps=70", "optim.lr=0.001"])
    c = load_config("tiny_softmax", ["train.steps=80", "optim.lr=0.001"])
    path = default_run_dir("tiny_softmax", a, runs_dir=tmp_path)
    assert path == default_run_dir("tiny_softmax", b, runs_dir=tmp_path)
    assert path.name.startswith("tiny_softmax-") and path != default_run_dir(
        "tiny_softmax", c, runs_dir=tmp_path)
    # the run dir itself does not change the name; --new picks the next free one
    assert default_run_dir("tiny_softmax", load_config(
        "tiny_softmax", ["optim.lr=1e-3", "train.steps=70", f"train.run_dir={tmp_path}"]),
        runs_dir=tmp_path) == path
    assert default_run_dir("tiny_softmax", a, runs_dir=tmp_path, new=True) == path
    path.mkdir()
    assert default_run_dir("tiny_softmax", a, runs_dir=tmp_path) == path
    assert default_run_dir("tiny_softmax", a, runs_dir=tmp_path, new=True).name == path.name + "-2"


def test_a_held_run_dir_is_refused_before_the_run_is_announced(tmp_path, corpus, capsys):
    run_dir = tmp_path / "held"
    with run_lock(run_dir):
        assert main(["fit", "tiny_softmax", *overrides(corpus, "train.steps=2"),
                     "--run-dir", str(run_dir)]) == 1
        out, err = capsys.readouterr()
    assert "new run" not in out and "resuming" not in out, out
    assert err.startswith("error: ") and "is in use by another process" in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_one_writer_per_run_dir_and_a_dead_holders_lock_is_stale(tmp_path):
    run_dir = tmp_path / "run"
    with run_lock(run_dir):
        with pytest.raises(RunLockedError, match=f"pid {os.getpid()}"):
            with run_lock(run_dir):
                pass
    with run_lock(run_dir):                          # released on exit
        pass
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
        "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, b'pid dead'); print('held', flush=True); "
        "os.kill(os.getpid(), 9)"), str(run_dir / "run.lock")], stdout=subprocess.PIPE)
    assert holder.stdout.readline() == b"held\n"
    holder.wait()
    assert (run_dir / "run.lock").read_text() == "pid dead"
    with run_lock(run_dir):                          # the holder died: the lock is stale
        pass
    with pytest.raises(ValueError):                  # an existing dir is kept on failure
        with claimed_run_dir(run_dir):
            raise ValueError
    assert run_dir.is_dir()


def test_a_process_refused_the_lock_leaves_the_holders_new_dir_alone(tmp_path, monkeypatch):
    """Two processes start on a fresh directory at once: the winner creates it and holds the
    lock; the loser saw no directory before, yet must not remove the winner's."""
    import train.core.runs as runs
    run_dir = tmp_path / "fresh"

    @contextlib.contextmanager
    def winner_holds_it(path):
        path.mkdir()
        (path / "config.json").write_text("{}")
        raise RunLockedError(f"{path} is in use by another process (pid 1)")
        yield

    monkeypatch.setattr(runs, "run_lock", winner_holds_it)
    with pytest.raises(RunLockedError):
        with claimed_run_dir(run_dir):
            pass
    assert (run_dir / "config.json").is_file()


def test_a_filesystem_without_locks_warns_and_runs(tmp_path, monkeypatch, caplog):
    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr("train.core.runs.fcntl.flock", no_locks)
    with run_lock(tmp_path / "nfs"):
        pass
    assert "does not support locks" in caplog.text


# ------------------------------------------------------------------ divergence

@pytest.fixture
def nan_at_step_3(monkeypatch):
    """The train step returns a NaN loss and NaN parameters at step 3 (0-based state step 2)."""
    original = train.core.session.make_train_step

    def make_train_step(*args):
        step_fn = original(*args)

        def poisoned(state, batch):
            new_state, metrics = step_fn(state, batch)
            bad = state["step"] == 2
            poison = lambda x: jnp.where(bad, jnp.nan, x) if jnp.issubdtype(x.dtype, jnp.floating) else x
            new_state = {**new_state, "params": jax.tree.map(poison, new_state["params"])}
            return new_state, {**metrics, "loss": poison(metrics["loss"])}

        return poisoned

    monkeypatch.setattr(train.core.session, "make_train_step", make_train_step)


@pytest.mark.slow
def test_divergence_stops_before_checkpointing_or_skips(tmp_path, corpus, capsys, nan_at_step_3):
    stop_dir = tmp_path / "stop"
    argv = ["fit", "tiny_softmax", *overrides(corpus, "train.steps=6", "train.checkpoint_every=2")]
    assert main([*argv, "--run-dir", str(stop_dir)]) == EXIT_DIVERGED
    line = error_line(capsys, after_progress=True)
    assert "diverged" in line and "step 3" in line
    assert checkpoint_steps(stop_dir) == [2]         # step 4 (after the NaN) was never saved

    skip_dir = tmp_path / "skip"
    assert main([*argv, "train.on_nonfinite=skip", "--run-dir", str(skip_dir)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"new run in {skip_dir}") and "1 non-finite skipped" in out
    assert [r["step"] for r in read_metrics(skip_dir) if r["kind"] == "skipped"] == [3]
    from train.core.runs import load_run
    config, tokenizer = load_run(skip_dir)
    restored = restore_run_state(skip_dir,
                                 train.core.session.build_session(config, tokenizer.vocab_size))
    assert restored.step == 6
    assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(restored.state))
    # the count is the run's, not the process's: a resumed run still reports the skipped step
    assert main([*argv, "train.on_nonfinite=skip", "train.steps=8", "--run-dir", str(skip_dir)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"resuming {skip_dir} from step 6") and "1 non-finite skipped" in out


def test_an_update_that_overflows_the_parameters_is_never_checkpointed(
        tmp_path, corpus, capsys, monkeypatch):
    """Step 3's update makes the parameters inf while its loss and gradients are finite: with a
    checkpoint every step and one kept, the good step-2 checkpoint must stay."""
    overflow_parameters_after(monkeypatch, 2)
    run_dir = tmp_path / "run"
    argv = ["fit", "tiny_softmax", *overrides(corpus, "train.steps=5", "train.checkpoint_every=1",
                                                "train.keep_checkpoints=1"),
            "--run-dir", str(run_dir)]
    assert main(argv) == EXIT_DIVERGED
    line = error_line(capsys, after_progress=True)
    assert "parameters after the update at step 3" in line and "checkpoint step 2" in line
    assert checkpoint_steps(run_dir) == [2]
    from train.core.runs import load_run
    config, tokenizer = load_run(run_dir)
    restored = restore_run_state(run_dir,
                                 train.core.session.build_session(config, tokenizer.vocab_size))
    assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(restored.state))


# ------------------------------------------------------------------ eval is read-only

def test_resuming_with_another_model_names_the_changed_keys(tmp_path, corpus, capsys):
    run_dir = tmp_path / "run"
    argv = ["fit", "tiny_softmax", *overrides(corpus, "train.steps=2", "train.checkpoint_every=2"),
            "--run-dir", str(run_dir)]
    assert main(argv) == 0
    capsys.readouterr()
    assert main([*argv[:-2], "model.d_model=24", *argv[-2:]]) == 1
    line = error_line(capsys, after_progress=True)
    assert "no longer matches the checkpoint" in line and "model.d_model: 16 -> 24" in line
    assert checkpoint_steps(run_dir) == [2]                       # the run is left as it was
    assert not list(run_dir.glob("config.*.json"))                # no copy of the refused config


def test_a_failed_start_in_a_directory_made_beforehand_leaves_only_what_was_there(
        tmp_path, corpus, capsys):
    """Job scripts create the output directory first: a run that fails before its first step
    removes its config, tokenizer and lock again, keeps the user's files, and the next
    (corrected) command starts cleanly with its own config."""
    run_dir = tmp_path / "made_by_the_job"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("mine")
    argv = ["fit", "tiny_softmax", *overrides(corpus, "train.steps=2"), "--run-dir", str(run_dir)]
    assert main([*argv[:-2], f"data.source={tmp_path / 'missing'}", *argv[-2:]]) == 1
    assert "does not exist" in error_line(capsys, after_progress=True)
    assert sorted(p.name for p in run_dir.iterdir()) == ["notes.txt"]
    assert main(argv) == 0
    assert json.loads((run_dir / "config.json").read_text())["data"]["source"] == str(corpus)


def test_eval_is_read_only_and_takes_step(tmp_path, corpus, capsys):
    run_dir = tmp_path / "run"
    assert main(["fit", "tiny_softmax", *overrides(corpus, "train.steps=4", "train.checkpoint_every=2"),
                 "--run-dir", str(run_dir)]) == 0
    assert checkpoint_steps(run_dir) == [2, 4]
    capsys.readouterr()
    for path in (checkpoint_dir(run_dir) / "4").rglob("*"):   # damage the newest step
        if path.is_file() and path.stat().st_size > 64 and "state" in str(path):
            path.write_bytes(b"\0" * path.stat().st_size)
    before = sorted(str(p) for p in run_dir.rglob("*"))
    assert main(["eval", str(run_dir), "--batches", "1"]) == 0
    assert capsys.readouterr().out.startswith(f"evaluated step 2 of {run_dir}")
    assert main(["eval", str(run_dir), "--step", "4", "--batches", "1"]) == 1
    assert "step 4" in error_line(capsys)
    assert main(["eval", str(run_dir), "--step", "3", "--batches", "1"]) == 1
    assert "no checkpoint step 3" in error_line(capsys)
    after = sorted(str(p) for p in run_dir.rglob("*") if not p.name.startswith("eval-step"))
    assert after == before                         # nothing moved to quarantine/, nothing deleted


# ------------------------------------------------------------------ exit codes (real signals)

@pytest.mark.slow
def test_sigterm_exits_75_after_checkpoint_and_rerunning_resumes(tmp_path, corpus):
    # the session's compilation cache (tests/conftest.py): the second run compiles nothing
    env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
    command = [sys.executable, "-m", "train", "fit", "tiny_softmax",
               *overrides(corpus, "train.steps=100000", "train.checkpoint_every=0")]

    def run_until_first_step():
        process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        first = process.stdout.readline()
        for line in process.stdout:
            if line.startswith("step "):
                break
        process.send_signal(signal.SIGTERM)
        rest = process.stdout.read()
        return first, process.wait(timeout=120), rest

    first, rc, rest = run_until_first_step()
    assert first.startswith("new run in runs/tiny_softmax-") and rc == EXIT_PREEMPTED, rest
    run_dir = tmp_path / first.split()[-1]
    steps = checkpoint_steps(run_dir)
    assert len(steps) == 1 and "stopped early by a signal" in rest
    first, rc, rest = run_until_first_step()         # the same command resumes that run
    assert first == f"resuming {run_dir.relative_to(tmp_path)} from step {steps[0]}\n"
    assert rc == EXIT_PREEMPTED and checkpoint_steps(run_dir)[-1] > steps[0]

    import orbax.checkpoint as ocp                   # the record names the real command line
    from train.checkpoint.manager import Checkpointer
    with Checkpointer(checkpoint_dir(run_dir), read_only=True) as checkpointer:
        record = checkpointer._manager.restore(
            checkpoint_steps(run_dir)[-1],
            args=ocp.args.Composite(record=ocp.args.JsonRestore()))["record"]
    assert record["command_line"][0].endswith("__main__.py")
    assert record["command_line"][1:] == command[3:]


def test_a_signal_before_the_first_step_exits_with_its_code_and_leaves_no_run_dir(
        tmp_path, corpus, capsys, monkeypatch):
    """SIGTERM while a run is still loading (before the training loop's own handler): exit 75
    and the fresh run directory removed; SIGINT there: 130. The caller's handler comes back.
    SIGINT starts at Python's own handler (KeyboardInterrupt): a suite started in the background
    of a non-interactive shell inherits SIGINT ignored, and its workers with it."""
    received = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    previous_interrupt = signal.signal(signal.SIGINT, signal.default_int_handler)
    import train.core.fit

    original = train.core.fit.build_session
    sent = []

    def build_session_then_signal(*args, **kwargs):
        # to this thread: os.kill may hand the signal to another of the process's threads,
        # whose handler then runs later, possibly where an exception is ignored
        signal.raise_signal(sent[-1])
        return original(*args, **kwargs)

    monkeypatch.setattr(train.core.fit, "build_session", build_session_then_signal)
    try:
        for signum, code, message in ((signal.SIGTERM, EXIT_PREEMPTED, "stopped by SIGTERM"),
                                      (signal.SIGINT, 130, "interrupted")):
            sent.append(signum)
            assert main(["fit", "tiny_softmax", *overrides(corpus, "train.steps=2"),
                         "--run-dir", str(tmp_path / "run")]) == code
            assert message in error_line(capsys, after_progress=True)
            assert not (tmp_path / "run").exists() and not received
        signal.raise_signal(signal.SIGTERM)
        assert received == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_interrupt)


def test_bench_refuses_a_step_that_cannot_fit_and_maps_out_of_memory(tmp_path, capsys, monkeypatch):
    """`bench` (how an operator tries a batch or context length) checks the memory estimate
    before compiling and turns XLA's out-of-memory into one line, as `fit` does."""
    import train.tools.bench

    argv = ["bench", "tiny_softmax", *TINY, "--steps", "1", "--out", str(tmp_path / "b.json")]
    monkeypatch.setattr("train.tools.bench.device_memory_bytes", lambda: 2**16)
    assert main([*argv, "--context", "64"]) == 1
    line = error_line(capsys)
    assert line.startswith("error: the train step needs at least") and "64.00 KiB" in line
    assert "data.seq_len (64)" in line
    monkeypatch.undo()

    class RunsOutOfMemory:
        def lower(self, *args):
            raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to "
                                             "allocate 9.00GiB.\nmore")

    original = train.tools.bench.build_session

    def build_session_that_runs_out(*args, **kwargs):
        session = original(*args, **kwargs)
        session.train_step = RunsOutOfMemory()
        return session

    monkeypatch.setattr(train.tools.bench, "build_session", build_session_that_runs_out)
    assert main(argv) == 1
    line = error_line(capsys)
    assert line.startswith("error: out of device memory (could not allocate ")
    assert "lower data.batch_size (2)" in line and not (tmp_path / "b.json").exists()


def test_help_into_a_closed_pipe_is_one_error_line():
    """`python -m train probe --help | head` closing the pipe early: one `error:` line and exit
    1, not a BrokenPipeError traceback (the help is printed while the arguments are parsed)."""
    read, write = os.pipe()
    os.close(read)              # every write of the child's help text now fails with EPIPE
    try:
        finished = subprocess.run([sys.executable, "-m", "train", "probe", "--help"], cwd=REPO,
                                  stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert finished.returncode == 1, finished.stderr
    assert finished.stderr.strip() == "error: the output was closed (broken pipe)"
