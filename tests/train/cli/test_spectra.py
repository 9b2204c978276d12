"""`python -m train spectra` (train/cli/spectra.py): its table fits 100 columns."""

import pytest

from train.cli.entry import main


@pytest.mark.slow
def test_the_spectra_table_fits_100_columns(gdn_cpt_runs, tmp_path, capsys):
    reference, extended, _ = gdn_cpt_runs
    capsys.readouterr()
    assert main(["spectra", str(reference), "--compare", str(extended), "--lengths", "40", "64",
                 "--samples", "1", "--out", str(tmp_path / "sp")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 100, "\n".join(lines)
    text = "\n".join(lines)
    for name in ("spectra.json", "slow_band.png", "compare_layers_0.png", f"{extended} (step 1)"):
        assert name in text
    assert any(line.startswith("ell=15 ") for line in lines), text
