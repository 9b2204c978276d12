"""`python -m train spectra` (train/cli/spectra.py): its table fits 100 columns; its needle
inputs can be rebuilt without measuring (train.experiments.spectra.needle_tokens)."""

import numpy as np
import pytest

from train.cli.entry import main


@pytest.mark.slow
def test_the_spectra_table_fits_100_columns(gdn_cpt_runs, tmp_path, capsys):
    reference, extended, _, _ = gdn_cpt_runs
    capsys.readouterr()
    assert main(["spectra", str(reference), "--compare", str(extended), "--lengths", "40", "64",
                 "--samples", "1", "--out", str(tmp_path / "sp")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 100, "\n".join(lines)
    text = "\n".join(lines)
    for name in ("spectra.json", "slow_band.png", "compare_layers_0.png", f"{extended} (step 1)"):
        assert name in text
    assert any(line.startswith("ell=15 ") for line in lines), text


@pytest.mark.slow
def test_needle_tokens_are_the_inputs_spectra_measures(gdn_cpt_runs):
    """The SpectralShift demo's --reference-from-results rebuilds the reference's needle inputs
    with needle_tokens instead of measuring it again: they must be spectra's own."""
    from train.experiments.spectra import needle_tokens, spectra

    reference, _, _, _ = gdn_cpt_runs
    position = 20
    _, _, measured = spectra(reference, lengths=[40, 64], needle_position=position,
                             num_samples=2)
    rebuilt = needle_tokens(reference, 64, 2, position)
    assert rebuilt.shape == (2, 64) and rebuilt.dtype == measured.dtype
    assert (rebuilt == measured).all() and len(set(map(bytes, rebuilt))) == 2
    # the needle's tokens end at the position, in held-out text of the run (its eval split)
    from train.core.runs import load_run
    from train.experiments.spectra import NEEDLE, haystack
    needle = np.asarray(load_run(reference)[1].encode(NEEDLE))
    at_needle = slice(position + 1 - len(needle), position + 1)
    assert (rebuilt[:, at_needle] == needle).all()
    text = haystack(reference, 64, 2)
    outside = np.ones(64, bool)
    outside[at_needle] = False
    assert (rebuilt[:, outside] == text[:, outside]).all()
