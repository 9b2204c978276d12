"""`python -m train cpt` (train/cli/cpt.py): the reference is checked before anything is
printed, and one line says what SpectralShift did (s, l_ref -> l_tar, the reference step, the
alpha learning rate)."""

import pytest

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
    reference, _, err = gdn_cpt_runs
    lines = [line for line in err.splitlines() if line.startswith("SpectralShift:")]
    assert len(lines) == 1, err
    assert lines[0].startswith("SpectralShift: l_ref 16 -> l_tar 32, s = (16 / 32) ** 0.5 "
                               "= 0.7071;"), lines
    assert f"{reference} step 1;" in lines[0] and "alpha learning rate x 0.7071" in lines[0]
