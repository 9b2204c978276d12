"""The one-layer softmax LM and small Python-like corpus that the CLI and reliability tests
train in a few seconds."""

import shutil
from pathlib import Path

import numpy as np

# a constant learning rate: runs of any train.steps compile one train step (the session's
# compilation cache, tests/conftest.py, serves it to every other run)
TINY = ["model.d_model=16", "model.num_layers=1", "attention.kind=softmax",
        "attention.position=rope", "attention.num_heads=2", "attention.head_dim=8",
        "data.seq_len=16", "data.batch_size=2", "data.heldout_fraction=0.2",
        "optim.warmup_steps=1", "optim.schedule=constant", "train.log_every=1",
        "train.eval_batches=1", "train.eval_every=0", "train.position_buckets=2"]

# the tiny_fpa preset at the same size (tests/train/conftest.py `tiny_fpa_run`)
TINY_FPA = [o for o in TINY if not o.startswith("attention.")] + ["attention.num_heads=2",
                                                                   "attention.head_dim=8"]

WORDS = ["def", "return", "x", "y", "(", ")", ":", "=", "+", "1", "\n", "    "]


def write_corpus(root: Path, seed: int, documents: int = 12) -> Path:
    """`documents` files doc_NN.py of 40..119 random WORDS each, under root."""
    rng = np.random.default_rng(seed)
    for index in range(documents):
        (root / f"doc_{index:02d}.py").write_text(
            " ".join(rng.choice(WORDS, size=int(rng.integers(40, 120)))))
    return root


def fit_tiny_run(root: Path, seed: int, documents: int = 12, steps: int = 2,
                 preset: str = "tiny_softmax", overrides: tuple[str, ...] = tuple(TINY)) -> Path:
    """Train the tiny softmax LM (or `preset` with `overrides`) for `steps` steps on a fresh
    corpus under root; the run dir."""
    from train.cli.entry import main

    corpus = root / "corpus"
    corpus.mkdir()
    write_corpus(corpus, seed=seed, documents=documents)
    run_dir = root / "run"
    assert main(["fit", preset, *overrides, f"data.source={corpus}", f"train.steps={steps}",
                 "train.tensorboard=false", "--run-dir", str(run_dir)]) == 0
    return run_dir


def copy_run(run_dir: Path, target: Path) -> Path:
    """A copy of a finished run at target (its corpus stays where it is), to write into."""
    shutil.copytree(run_dir, target)
    return target
