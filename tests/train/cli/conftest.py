"""Fixtures shared by the command-line tests."""

import contextlib
import io

import pytest

from tests.train.tiny_run import write_corpus
from train.cli.entry import main


GDN = ["model.d_model=16", "model.num_layers=1", "model.pattern=G", "gdn.num_heads=2",
       "gdn.head_dim=8", "gdn.implementation=reference", "data.batch_size=2",
       "data.heldout_fraction=0.2", "train.eval_batches=1", "train.log_every=1",
       "train.position_buckets=2", "train.tensorboard=false", "optim.warmup_steps=0"]


@pytest.fixture(scope="session")
def gdn_cpt_runs(tmp_path_factory):
    """A one-step GDN reference at context 16 and one cpt step of it at 32, with what the cpt
    command wrote on stderr and its command line (without train.steps and --run-dir). The cpt
    run's learning rate is 1e-12 (constant), so its weights stay where SpectralShift put them."""
    root = tmp_path_factory.mktemp("notes")
    corpus = root / "corpus"
    corpus.mkdir()
    write_corpus(corpus, seed=51)
    reference, extended = root / "ref", root / "cpt"
    source = f"data.source={corpus}"
    assert main(["fit", "tiny_gdn", *GDN, source, "data.seq_len=16", "train.steps=1",
                 "--run-dir", str(reference)]) == 0
    cpt = ["cpt", "gdn_tiny_cpt", *GDN, source, "data.seq_len=32", "optim.lr=1e-12",
           "optim.schedule=constant", f"cpt.reference={reference}"]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main([*cpt, "train.steps=1", "--run-dir", str(extended)]) == 0
    return reference, extended, err.getvalue(), cpt
