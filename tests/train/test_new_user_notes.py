"""What a new user is told: a tiny preset with a small train.steps scales its warm-up down
(one `note:` line) instead of failing; `prepare` says why its BPE tokenizer is smaller than
--vocab-size; `cpt` prints one line with what SpectralShift did (s, l_ref -> l_tar, the
reference step); the `spectra` summary table fits 100 columns."""

import contextlib
import io

import pytest

from tests.train.tiny_run import write_corpus

GDN = ["model.d_model=16", "model.num_layers=1", "model.pattern=G", "gdn.num_heads=2",
       "gdn.head_dim=8", "gdn.implementation=reference", "data.batch_size=2",
       "data.heldout_fraction=0.2", "train.eval_batches=1", "train.log_every=1",
       "train.position_buckets=2", "train.tensorboard=false", "optim.warmup_steps=0",
       "train.steps=1"]


def test_a_small_train_steps_scales_the_presets_warmup_with_a_note(capsys):
    from train.cli.entry import main

    assert main(["config", "tiny_fpa", "train.steps=5"]) == 0     # tiny: warm-up 30 of 600
    captured = capsys.readouterr()
    assert "  warmup_steps: 0\n" in captured.out and "  steps: 5\n" in captured.out
    notes = captured.err.splitlines()
    assert len(notes) == 1 and notes[0].startswith("note: optim.warmup_steps=30"), notes
    assert "train.steps=5" in notes[0] and "scaled down to 0" in notes[0]

    assert main(["config", "tiny_fpa", "train.steps=300"]) == 0    # fits: unchanged
    captured = capsys.readouterr()
    assert "  warmup_steps: 30\n" in captured.out and captured.err == ""
    assert main(["config", "tiny_fpa", "train.steps=5", "optim.warmup_steps=5"]) == 2
    err = capsys.readouterr().err.splitlines()                     # explicit: refused
    assert len(err) == 1 and err[0].startswith("error: optim.warmup_steps=5 must be < "
                                               "train.steps=5"), err


def test_prepare_says_why_the_tokenizer_is_smaller_than_asked(tmp_path, capsys):
    from train.cli.entry import main

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.py").write_text("abc def ghi\n")                  # no pair occurs twice
    (corpus / "b.py").write_text("xyz uvw\n")
    assert main(["prepare", "--source", str(corpus), "--out", str(tmp_path / "out"),
                 "--vocab-size", "300", "--num-shards", "1"]) == 0
    notes = capsys.readouterr().err.splitlines()
    assert len(notes) == 1 and notes[0].startswith(
        "note: the tokenizer has 257 entries, fewer than --vocab-size 300"), notes
    assert "at least twice" in notes[0]


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


def test_the_spectra_table_fits_100_columns(runs, tmp_path, capsys):
    from train.cli.entry import main

    reference, extended, _ = runs
    capsys.readouterr()
    assert main(["spectra", str(reference), "--compare", str(extended), "--lengths", "40", "64",
                 "--samples", "1", "--out", str(tmp_path / "sp")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 100, "\n".join(lines)
    text = "\n".join(lines)
    for name in ("spectra.json", "slow_band.png", "compare_layers_0.png", f"{extended} (step 1)"):
        assert name in text
    assert any(line.startswith("ell=15 ") for line in lines), text
