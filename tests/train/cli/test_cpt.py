"""`python -m train cpt` (train/cli/cpt.py): the reference is checked before anything is
printed, one line says what SpectralShift did (s, l_ref -> l_tar, the reference step, the
alpha learning rate), and the shift is applied once (train/experiments/cpt.py)."""

import numpy as np
import pytest

from tests.train.tiny_run import copy_run
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


@pytest.mark.slow
def test_cpt_prints_what_spectral_shift_did(gdn_cpt_runs):
    reference, _, err, _ = gdn_cpt_runs
    lines = [line for line in err.splitlines() if line.startswith("SpectralShift:")]
    assert len(lines) == 1, err
    assert lines[0].startswith("SpectralShift: l_ref 16 -> l_tar 32, s = (16 / 32) ** 0.5 "
                               "= 0.7071;"), lines
    assert f"{reference} step 1;" in lines[0] and "alpha learning rate x 0.7071" in lines[0]


@pytest.mark.slow
def test_spectral_shift_applies_once(gdn_cpt_runs, tmp_path, capsys):
    """cpt from the 1-layer GDN reference, extending l_ref 16 to l_tar 32 (k = 0.5: s = 0.7071):
    the alpha kernels start at mu + s (W - mu); the run resumed for a second step (in a copy)
    does not shift them again."""
    from train.core.runs import load_run, restore_run_state
    from train.core.session import build_session

    reference_dir, extended, _, cpt = gdn_cpt_runs
    cpt_dir = copy_run(extended, tmp_path / "cpt")
    capsys.readouterr()
    assert main([*cpt, "train.steps=2", "--run-dir", str(cpt_dir)]) == 0
    captured = capsys.readouterr()
    assert "2 (started at 1)" in captured.out and "SpectralShift" not in captured.err
    restored = {}
    for name, path in [("reference", reference_dir), ("cpt", cpt_dir)]:
        config, tokenizer = load_run(path)
        restored[name] = restore_run_state(path, build_session(config, tokenizer.vocab_size))
    s = (16 / 32) ** 0.5
    reference = restored["reference"].state["params"]["layers_0"]["mixer"]
    shifted = restored["cpt"].state["params"]["layers_0"]["mixer"]
    w_ref = np.asarray(reference["a_proj"]["kernel"])
    w_cpt = np.asarray(shifted["a_proj"]["kernel"])
    mu = w_ref.mean()
    np.testing.assert_allclose(w_cpt, mu + s * (w_ref - mu), atol=1e-6)  # once, not twice
    assert np.abs(w_cpt - w_ref).max() > 1e-3
    np.testing.assert_allclose(shifted["b_proj"]["kernel"], reference["b_proj"]["kernel"],
                               atol=1e-6)
    np.testing.assert_allclose(shifted["A_log"], reference["A_log"], atol=1e-6)
    assert restored["cpt"].step == 2
    assert load_run(cpt_dir)[0].optim.alpha_lr_scale == pytest.approx(s)
    (marker,) = restored["cpt"].record["extra"]["spectral_shift_applied"]
    assert (marker["l_ref"], marker["l_tar"], marker["s"]) == (16, 32, pytest.approx(s))
    assert marker["reference_step"] == 1
