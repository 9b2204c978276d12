"""The one-call GPU scripts (benchmarks/gpu/*.sh) parse, and every repository file they name
exists (they run only on a GPU machine, where a typo costs a whole device call)."""

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((REPO / "benchmarks" / "gpu").glob("*.sh"))
NAMED = re.compile(r"(?<![\w/.])((?:benchmarks|configs|train|tests)/[\w/.-]+\.(?:py|sh|yaml))")


def test_there_are_scripts():
    assert len(SCRIPTS) >= 5


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_script_parses_and_names_existing_files(script):
    parsed = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert parsed.returncode == 0, parsed.stderr
    missing = sorted({name for name in NAMED.findall(script.read_text())
                      if not (REPO / name).exists()})
    assert not missing, f"{script.name} names files that do not exist: {missing}"
