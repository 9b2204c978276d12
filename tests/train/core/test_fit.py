"""End-to-end training runs in subprocesses: exact resume after SIGTERM and after kill -9 in the
middle of an async checkpoint save, eval, plot and bench (SpectralShift continued pretraining:
tests/train/cli/test_cpt.py).

All runs share one persistent compilation cache, so only the first run of each model compiles.
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from train.core.metrics import read_metrics

REPO = Path(__file__).resolve().parents[3]

TINY = ["model.d_model=32", "model.num_layers=2", "attention.kind=softmax",
        "attention.position=rope", "attention.num_heads=2", "attention.head_dim=16",
        "data.seq_len=32", "data.batch_size=4", "data.heldout_fraction=0.2",
        "optim.warmup_steps=2", "optim.lr=3e-3", "train.log_every=1", "train.eval_batches=2",
        "train.position_buckets=4"]

# Runs `train.core.fit.fit` for each of options["runs"], with optional fault injection:
#   sigterm_after_steps: the process sends itself SIGTERM after that many train steps
#   sigkill_in_save: SIGKILL inside the n-th checkpoint save of the process, after the save
#                    started (the iterator item is written) and before the step is committed
DRIVER = textwrap.dedent("""
    import json, os, signal, sys
    options = json.loads(sys.argv[1])
    from train.checkpoint import iterator_state
    from train.core import fit
    from train.core.presets import load_config

    if options.get("sigterm_after_steps"):
        original_build = fit.build_session

        def build_session(*a, **k):
            session = original_build(*a, **k)
            step_fn, calls = session.train_step, [0]

            def train_step(state, batch):
                calls[0] += 1
                out = step_fn(state, batch)
                if calls[0] == options["sigterm_after_steps"]:
                    os.kill(os.getpid(), signal.SIGTERM)
                return out

            session.train_step = train_step
            return session

        fit.build_session = build_session

    if options.get("sigkill_in_save"):
        original_save, saves = iterator_state._IteratorStateHandler.save, [0]

        def save(self, directory, args):  # noqa: A002 - Orbax passes it by this name
            original_save(self, directory, args=args)
            saves[0] += 1
            if saves[0] == options["sigkill_in_save"]:
                os.kill(os.getpid(), signal.SIGKILL)

        iterator_state._IteratorStateHandler.save = save

    for job in options["runs"]:  # one after the other in this process
        result = fit.fit(load_config(None, job["overrides"]), job["run_dir"])
        print("RESULT " + json.dumps({"steps": result.steps, "start_step": result.start_step,
                                      "preempted": result.preempted, "eval_loss": result.eval_loss,
                                      "latest": result.latest_checkpoint}), flush=True)
""")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A small text corpus: 40 documents of pseudo-code of varied length."""
    root = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    words = ["def", "return", "for", "in", "if", "else", "x", "y", "value", "range", "(", ")",
             ":", "=", "+", "1", "2", "self", "class", "import", "print", "\n", "    "]
    for index in range(40):
        text = " ".join(rng.choice(words, size=int(rng.integers(50, 400))))
        (root / f"doc_{index:02d}.py").write_text(text)
    return root


def run_driver(environment, runs, expect_rc=0, **options):
    """runs: [(run_dir, overrides)]; returns the FitResults (as dicts) of the runs that
    finished."""
    jobs = [{"run_dir": str(d), "overrides": o} for d, o in runs]
    completed = subprocess.run([sys.executable, "-c", DRIVER, json.dumps({"runs": jobs, **options})],
                               cwd=REPO, env=environment, capture_output=True, text=True,
                               timeout=600)
    assert completed.returncode == expect_rc, completed.stderr[-4000:]
    return [json.loads(line[len("RESULT "):]) for line in completed.stdout.splitlines()
            if line.startswith("RESULT ")]


def train_losses(run_dir):
    return {r["step"]: r["loss"] for r in read_metrics(run_dir) if r["kind"] == "train"}


def committed_steps(run_dir):
    return sorted(int(p.name) for p in (Path(run_dir) / "checkpoints").iterdir() if p.name.isdigit())


@pytest.mark.slow
def test_interrupted_runs_resume_exactly(tmp_path, corpus, environment, capsys):
    """One test (so pytest-xdist runs these subprocesses once): an uninterrupted 8-step run, and
    the same run stopped by SIGTERM after step 4, resumed (in the same process), killed by
    SIGKILL inside the async checkpoint save of step 6, and resumed again to step 8 in a fresh
    process: same losses step by step, same final eval loss. Then the eval and plot commands on
    the finished run."""
    overrides = TINY + [f"data.source={corpus}", "train.steps=8", "train.checkpoint_every=3",
                        "train.keep_checkpoints=2"]
    straight_dir, interrupted = tmp_path / "straight", tmp_path / "interrupted"

    # SIGTERM: the current step (4) is saved, then the run stops cleanly; in the same process
    # (one start-up less) the run resumes and SIGKILL hits the middle of the async save of
    # step 6, the process's third save (3, 4, 6): steps 3 and 4 survive, 6 is not committed.
    # The resume from step 4 in a fresh process is the last driver's.
    (stopped,) = run_driver(environment, [(interrupted, overrides)] * 2, expect_rc=-9,
                            sigterm_after_steps=4, sigkill_in_save=3)
    assert stopped["preempted"] and stopped["steps"] == 4 and stopped["latest"] == 4
    assert committed_steps(interrupted) == [3, 4]
    entries = sorted(p.name for p in (interrupted / "checkpoints").iterdir())
    assert "3" in entries and "4" in entries and "6" not in entries
    assert any(name.startswith("6.") and "tmp" in name for name in entries), entries
    before_final_resume = train_losses(interrupted)
    assert set(before_final_resume) == set(range(1, 7))

    # the uninterrupted run shares the resuming process, after the resume (one start-up less)
    resumed, straight = run_driver(environment, [(interrupted, overrides),
                                                 (straight_dir, overrides)])
    assert resumed["start_step"] == 4 and resumed["steps"] == 8
    straight_losses, resumed_losses = train_losses(straight_dir), train_losses(interrupted)
    assert sorted(straight_losses) == sorted(resumed_losses) == list(range(1, 9))
    assert len(set(straight_losses.values())) == 8
    np.testing.assert_allclose([resumed_losses[s] for s in range(1, 9)],
                               [straight_losses[s] for s in range(1, 9)], rtol=0, atol=1e-6)
    np.testing.assert_allclose([before_final_resume[5], before_final_resume[6]],
                               [straight_losses[5], straight_losses[6]], rtol=0, atol=1e-6)
    np.testing.assert_allclose(resumed["eval_loss"], straight["eval_loss"], rtol=0, atol=1e-6)

    # what the run directory holds
    assert committed_steps(straight_dir) == [6, 8]  # keep_checkpoints=2
    config = json.loads((straight_dir / "config.json").read_text())
    assert config["train"]["steps"] == 8 and config["model"]["d_model"] == 32
    assert (straight_dir / "tokenizer" / "tokenizer_meta.json").is_file()
    assert list((straight_dir / "tensorboard").glob("events.out.tfevents.*"))
    (final_eval,) = [r for r in read_metrics(straight_dir) if r["kind"] == "eval"]
    assert final_eval["step"] == 8 and final_eval["position_bucket_start"] == [0, 8, 16, 24]
    assert sum(final_eval["position_tokens"]) == final_eval["tokens"] > 0
    weighted = sum(l * n for l, n in zip(final_eval["position_loss"], final_eval["position_tokens"]))
    np.testing.assert_allclose(weighted / final_eval["tokens"], final_eval["loss"], rtol=1e-5)

    # `eval` re-evaluates the newest checkpoint; `plot` draws the curves (in this process:
    # `python -m train eval` in a fresh one is tests/train/cli/test_entry_unreadable_runs.py's)
    from train.cli.entry import main

    capsys.readouterr()
    assert main(["eval", str(straight_dir), "--batches", "2"]) == 0
    assert "eval loss" in capsys.readouterr().out
    written = json.loads((straight_dir / "eval-step8-len32.json").read_text())
    np.testing.assert_allclose(written["loss"], straight["eval_loss"], rtol=0, atol=1e-6)

    assert main(["plot", str(straight_dir), "--out", str(tmp_path / "plots")]) == 0
    for name in ("loss.png", "position_loss.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:4] == b"\x89PNG"


def test_bench_command_reports_throughput_and_memory(tmp_path, capsys):
    from train.cli.entry import main

    out = tmp_path / "bench.json"
    assert main(["bench", "tiny_softmax", "model.num_layers=1", "model.d_model=32",
                 "attention.num_heads=2", "attention.head_dim=16", "--context", "16",
                 "--batch-size", "2", "--steps", "2", "--warmup", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["seq_len"] == 16 and result["batch_size"] == 2 and result["steps"] == 2
    assert result["tokens_per_second"] > 0 and result["peak_memory_bytes"] > 0
    assert np.isfinite(result["final_loss"])
    assert "tokens/s" in capsys.readouterr().out


def test_prepare_command_writes_shards_and_tokenizer(tmp_path, corpus, capsys):
    from train.cli.entry import main
    from train.data.tokenizer import load_tokenizer

    out = tmp_path / "prepared"
    assert main(["prepare", "--source", str(corpus), "--out", str(out), "--vocab-size", "300",
                 "--num-shards", "2", "--max-documents", "6"]) == 0
    assert len(list(out.glob("*.arrayrecord"))) == 2
    tokenizer = load_tokenizer(out / "tokenizer")
    assert tokenizer.kind == "bpe" and 257 < tokenizer.vocab_size <= 300
    assert f"data.source=arrayrecord:{out}" in capsys.readouterr().out
