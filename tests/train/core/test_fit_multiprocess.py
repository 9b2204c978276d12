"""Multi-process training on one machine: 2 processes x 4 CPU devices with jax.distributed
(coordinator on localhost, a free port), against this (single-process, one-device) pytest
process.

  * the first steps' losses of the 2-process run (mesh data 2 x fsdp 2 x tensor 2, each process
    feeding its half of the rows) equal the single-process run's on the same global batches;
  * each process reads a disjoint part of the documents (train/data/pipeline.py: i % P == p);
  * a checkpoint saved by the 2 processes restores here (1 process) and one saved here restores
    in the 2 processes; both continue with the single-process losses;
  * `python -m train fit` in 2 processes: SIGTERM to one of them stops both at the same step
    with a checkpoint and exit code 75.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from tests.devices import xla_flags
from tests.seeds import case_seed
from train.checkpoint.manager import Checkpointer
from train.core.presets import load_config
from train.core.runs import checkpoint_dir, checkpoint_steps
from train.core.session import build_session, to_global
from train.core.sharding import make_mesh, mesh_context

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
OVERRIDES = ["model.d_model=16", "model.num_layers=1", "model.pattern=A",
             "attention.kind=softmax", "attention.position=rope", "attention.num_heads=2",
             "attention.head_dim=8", "data.seq_len=16", "data.batch_size=8",
             "data.heldout_fraction=0.2", "optim.warmup_steps=1", "optim.lr=3e-3",
             "train.steps=5"]
VOCAB = 257
FIRST, LATER = 3, 2           # steps before the checkpoint, steps after it

WORKER = textwrap.dedent("""
    import json, re, sys
    import jax, numpy as np
    from train.core.sharding import maybe_initialize_distributed
    assert maybe_initialize_distributed()
    assert jax.process_count() == 2 and jax.device_count() == 8, jax.devices()
    from train.checkpoint.manager import Checkpointer
    from train.core.presets import load_config
    from train.core.session import build_session, make_split_dataset, to_global
    from train.core.sharding import make_mesh, mesh_context
    from train.data.tokenizer import load_tokenizer

    spec = json.loads(sys.argv[1])
    config = load_config(None, spec["overrides"])
    batches = [{k: np.asarray(v, np.int32) for k, v in b.items()} for b in spec["batches"]]
    rows = config.data.batch_size // 2
    mine = slice(jax.process_index() * rows, (jax.process_index() + 1) * rows)
    session = build_session(config, spec["vocab"], make_mesh((2, 2, 2)))

    def run(state, batches):
        losses = []
        for batch in batches:
            local = {k: v[mine] for k, v in batch.items()}
            state, metrics = session.train_step(state, to_global(session, local))
            losses.append(float(metrics["loss"]))
        return state, losses

    with mesh_context(session.mesh):
        state, first = run(session.init_state(), batches[:spec["first"]])
        with Checkpointer(spec["saved_by_two"], save_interval_steps=1, async_save=False) as c:
            c.save(spec["first"], state=state)
        with Checkpointer(spec["saved_by_one"], save_interval_steps=1, async_save=False) as c:
            restored = c.restore_latest(session.abstract_state)
        _, later = run(restored.state, batches[spec["first"]:])

    tokenizer = load_tokenizer(config.data.tokenizer)
    batch = next(iter(make_split_dataset(config, tokenizer, "train")))
    text = " ".join(tokenizer.decode([int(t) for t in row]) for row in batch["tokens"])
    markers = sorted({w for w in text.split() if re.fullmatch("marker[0-9][0-9]", w)})
    print("RESULT " + json.dumps({"process": jax.process_index(), "first": first,
                                  "later": later, "markers": markers}), flush=True)
""")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def distributed_env(process_id: int, port: int) -> dict[str, str]:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO),
               XLA_FLAGS=xla_flags(4),
               JAX_COORDINATOR_ADDRESS=f"localhost:{port}", JAX_NUM_PROCESSES="2",
               JAX_PROCESS_ID=str(process_id))
    for name in ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"):
        env.pop(name, None)
    return env


def start_two(argv: list[str], cwd: Path) -> list[subprocess.Popen]:
    port = free_port()
    return [subprocess.Popen(argv, cwd=cwd, env=distributed_env(i, port), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for i in range(2)]


def finish(processes: list[subprocess.Popen], timeout: float) -> list[tuple[int, str, str]]:
    results = []
    deadline = time.time() + timeout
    for process in processes:
        try:
            out, err = process.communicate(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            raise
        results.append((process.returncode, out, err))
    return results


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """24 documents, each naming its own marker word, so a batch shows which it came from."""
    root = tmp_path_factory.mktemp("corpus")
    for index in range(24):
        (root / f"doc_{index:02d}.txt").write_text(f"marker{index:02d} " * 12 + "\n")
    return root


def test_two_processes_train_read_and_checkpoint_like_one(tmp_path, corpus):
    overrides = OVERRIDES + [f"data.source={corpus}"]
    config = load_config(None, overrides)
    rng = np.random.default_rng(case_seed(1301))
    batches = []
    for _ in range(FIRST + LATER):
        cut = rng.integers(1, 16, 8)
        batches.append({"tokens": rng.integers(0, VOCAB, (8, 17), dtype=np.int32),
                        "segment_ids": np.where(np.arange(17)[None] < cut[:, None], 1, 2)
                        .astype(np.int32)})

    session = build_session(config, VOCAB, make_mesh((1, 1, 1), jax.devices()[:1]))

    def run(state, batches):
        losses = []
        for batch in batches:
            state, metrics = session.train_step(state, to_global(session, batch))
            losses.append(float(metrics["loss"]))
        return state, losses

    saved_by_one, saved_by_two = tmp_path / "saved_by_one", tmp_path / "saved_by_two"
    with mesh_context(session.mesh):
        state, reference = run(session.init_state(), batches[:FIRST])
        with Checkpointer(saved_by_one, save_interval_steps=1, async_save=False) as checkpointer:
            checkpointer.save(FIRST, state=state)
        _, reference_later = run(state, batches[FIRST:])

    spec = {"overrides": overrides, "vocab": VOCAB, "first": FIRST,
            "batches": [{k: v.tolist() for k, v in b.items()} for b in batches],
            "saved_by_one": str(saved_by_one), "saved_by_two": str(saved_by_two)}
    results = finish(start_two([sys.executable, "-c", WORKER, json.dumps(spec)], REPO), 500)
    reports = []
    for code, out, err in results:
        assert code == 0, err[-4000:]
        line = [l for l in out.splitlines() if l.startswith("RESULT ")][-1]
        reports.append(json.loads(line[len("RESULT "):]))

    for report in reports:
        np.testing.assert_allclose(report["first"], reference, rtol=0, atol=1e-5)
        np.testing.assert_allclose(report["later"], reference_later, rtol=0, atol=1e-5)
    first, second = (set(r["markers"]) for r in sorted(reports, key=lambda r: r["process"]))
    assert first and second and not first & second

    with mesh_context(session.mesh):
        with Checkpointer(saved_by_two, save_interval_steps=1, async_save=False) as checkpointer:
            restored = checkpointer.restore_latest(session.abstract_state)
        assert restored.step == FIRST
        _, later = run(restored.state, batches[FIRST:])
    np.testing.assert_allclose(later, reference_later, rtol=0, atol=1e-5)


def test_sigterm_to_one_process_stops_both_with_a_checkpoint(tmp_path, corpus):
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "train", "fit", "tiny_softmax", *OVERRIDES,
            f"data.source={corpus}", "train.steps=100000", "train.log_every=1",
            "train.checkpoint_every=0", "train.eval_batches=1", "train.tensorboard=false",
            "--run-dir", str(run_dir)]
    processes = start_two(argv, REPO)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 300
    while not (metrics.exists() and '"train"' in metrics.read_text()):
        if time.time() > deadline or any(p.poll() is not None for p in processes):
            for process in processes:
                process.kill()
            pytest.fail("the 2-process run did not start training: "
                        + "\n".join(p.communicate()[1][-2000:] for p in processes))
        time.sleep(0.5)
    processes[1].send_signal(signal.SIGTERM)
    results = finish(processes, 300)
    # process 0 got no signal: its exit code 75 is the stop gathered from process 1
    for code, _, err in results:
        assert code == 75, err[-4000:]
    assert "received SIGTERM" in results[1][2] and "received SIGTERM" not in results[0][2]
    steps = checkpoint_steps(run_dir)
    assert steps and steps[-1] >= 1
    assert (checkpoint_dir(run_dir) / str(steps[-1]) / "state").is_dir()
