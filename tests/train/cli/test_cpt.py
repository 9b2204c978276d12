"""`python -m train cpt` (train/cli/cpt.py): the reference is checked before anything is
printed, and one line says what SpectralShift did (s, l_ref -> l_tar, the reference step, the
alpha learning rate)."""

import contextlib
import io

import pytest

from tests.train.tiny_run import write_corpus
from train.cli.entry import main


def one_error_line(text):
    lines = text.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), text
    return lines[0]


@pytest.mark.parametrize("reference", ["missing", "not-a-run"])
def test_cpt_checks_the_reference_before_printing(tmp_path, capsys, reference):
    (tmp_path / "not-a-run").mkdir()
    run_dir = tmp_path / "cpt"
    assert main(["cpt", "gdn_tiny_cpt", f"cpt.reference={tmp_path / reference}",
                 "--run-dir", str(run_dir)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""                       # no "new run in ..." before the error
    assert "cpt.reference" in one_error_line(captured.err)
    assert not run_dir.exists()


def test_cpt_without_a_reference_prints_nothing_but_the_error(tmp_path, capsys):
    assert main(["cpt", "gdn_tiny_cpt", "--run-dir", str(tmp_path / "cpt")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "cpt.reference" in one_error_line(captured.err)


GDN = ["model.d_model=16", "model.num_layers=1", "model.pattern=G", "gdn.num_heads=2",
       "gdn.head_dim=8", "gdn.implementation=reference", "data.batch_size=2",
       "data.heldout_fraction=0.2", "train.eval_batches=1", "train.log_every=1",
       "train.position_buckets=2", "train.tensorboard=false", "optim.warmup_steps=0",
       "train.steps=1"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A one-step GDN reference at context 16 and one cpt step of it at 32, with what the cpt
    command wrote on stderr."""
    from train.cli.entry import main

    root = tmp_path_factory.mktemp("notes")
    corpus = root / "corpus"
    corpus.mkdir()
    write_corpus(corpus, seed=51)
    reference, extended = root / "ref", root / "cpt"
    source = f"data.source={corpus}"
    assert main(["fit", "tiny_gdn", *GDN, source, "data.seq_len=16",
                 "--run-dir", str(reference)]) == 0
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["cpt", "gdn_tiny_cpt", *GDN, source, "data.seq_len=32",
                     f"cpt.reference={reference}", "--run-dir", str(extended)]) == 0
    return reference, extended, err.getvalue()


def test_cpt_prints_what_spectral_shift_did(runs):
    reference, _, err = runs
    lines = [line for line in err.splitlines() if line.startswith("SpectralShift:")]
    assert len(lines) == 1, err
    assert lines[0].startswith("SpectralShift: l_ref 16 -> l_tar 32, s = (16 / 32) ** 0.5 "
                               "= 0.7071;"), lines
    assert f"{reference} step 1;" in lines[0] and "alpha learning rate x 0.7071" in lines[0]
