"""README's SpectralShift commands name `runs/tiny_gdn`: that is the run
directory of `fit tiny_gdn` only without overrides, which the README must say (with what to
pass instead), and a curriculum whose reference is missing points at --reference."""

import json
from pathlib import Path

from train.core.presets import load_config
from train.core.runs import default_run_dir

REPO = Path(__file__).resolve().parents[3]


def spectralshift_section() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("## Extending the context of a GDN model (SpectralShift)")
    return text[start:text.index("\n## ", start + 1)]


def test_readme_says_when_runs_tiny_gdn_exists():
    section = spectralshift_section()
    assert "python -m train fit tiny_gdn " in section and "runs/tiny_gdn " in section
    # the commands' assumption: no overrides -> runs/tiny_gdn; any override -> another one
    assert default_run_dir("tiny_gdn", load_config("tiny_gdn", [])) == Path("runs/tiny_gdn")
    other = default_run_dir("tiny_gdn", load_config("tiny_gdn", ["train.steps=50"]))
    assert other.name.startswith("tiny_gdn-") and other != Path("runs/tiny_gdn")
    flat = " ".join(section.split())
    assert "only without overrides" in flat, flat
    assert "runs/tiny_gdn-<hash>" in flat and "stages --reference" in flat, flat
    assert "--run-dir runs/tiny_gdn" in flat, flat


def test_missing_curriculum_reference_points_at_the_option(tmp_path, capsys):
    from train.cli.entry import main

    curriculum = tmp_path / "curriculum.yaml"
    curriculum.write_text(json.dumps({
        "config": "gdn_tiny_cpt", "reference": str(tmp_path / "tiny_gdn"),
        "stages": [{"name": "len1024", "overrides": ["data.seq_len=1024"]}]}))
    assert main(["stages", str(curriculum), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert "not a run directory" in err[0] and "--reference names the run stage 1 extends" \
        in err[0], err[0]
    assert not (tmp_path / "out").exists()
