"""The one-layer softmax LM and small Python-like corpus that the CLI and reliability tests
train in a few seconds."""

import shutil
from pathlib import Path

import numpy as np

TINY = ["model.d_model=16", "model.num_layers=1", "attention.kind=softmax",
        "attention.position=rope", "attention.num_heads=2", "attention.head_dim=8",
        "data.seq_len=16", "data.batch_size=2", "data.heldout_fraction=0.2",
        "optim.warmup_steps=1", "train.log_every=1", "train.eval_batches=1",
        "train.eval_every=0", "train.position_buckets=2"]

WORDS = ["def", "return", "x", "y", "(", ")", ":", "=", "+", "1", "\n", "    "]


def write_corpus(root: Path, seed: int, documents: int = 12) -> Path:
    """`documents` files doc_NN.py of 40..119 random WORDS each, under root."""
    rng = np.random.default_rng(seed)
    for index in range(documents):
        (root / f"doc_{index:02d}.py").write_text(
            " ".join(rng.choice(WORDS, size=int(rng.integers(40, 120)))))
    return root


def fit_tiny_run(root: Path, seed: int, documents: int = 12, steps: int = 2) -> Path:
    """Train the tiny softmax LM for `steps` steps on a fresh corpus under root; the run dir."""
    from train.cli.entry import main

    corpus = root / "corpus"
    corpus.mkdir()
    write_corpus(corpus, seed=seed, documents=documents)
    run_dir = root / "run"
    assert main(["fit", "tiny_softmax", *TINY, f"data.source={corpus}", f"train.steps={steps}",
                 "train.tensorboard=false", "--run-dir", str(run_dir)]) == 0
    return run_dir


def copy_run(run_dir: Path, target: Path) -> Path:
    """A copy of a finished run at target (its corpus stays where it is), to write into."""
    shutil.copytree(run_dir, target)
    return target
