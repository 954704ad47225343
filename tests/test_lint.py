"""`ruff` is clean with the rules and line length pyproject.toml declares, and no `# noqa`
silences a rule that is not even selected (such a comment suppresses nothing and only hides
what the line is about)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINTED = ("olingo", "tests", "bench")  # what `make lint` checks
# `# noqa: E402, F401 - why`: the codes that follow, up to the first thing that is not a code.
NOQA = re.compile(r"#\s*noqa:\s*((?:[A-Z]+[0-9]+\s*,?\s*)+)")


def ruff_executable() -> str | None:
    """The ruff of the virtual environment running the tests, else one on PATH."""
    beside = Path(sys.executable).parent / "ruff"
    return str(beside) if beside.is_file() else shutil.which("ruff")


def selected_families() -> set[str]:
    """The rule families `[tool.ruff.lint] select` names: {"E", "F", "W", "I", "B", "UP"}."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    return set(config["tool"]["ruff"]["lint"]["select"])


def family_of(code: str) -> str:
    """'ANN001' -> 'ANN', 'E402' -> 'E', 'UP007' -> 'UP'."""
    return re.match(r"[A-Z]+", code).group()


def noqa_codes_outside(selected: set[str]) -> list[str]:
    """'path:line: CODE' for every `# noqa` code whose family is not selected."""
    found = []
    for root in LINTED:
        for path in sorted((REPO / root).rglob("*.py")):
            if any(part.startswith(".") for part in path.relative_to(REPO).parts):
                continue  # virtual environments (bench/.venvs) and caches: not ours, git ignores them
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
                for match in NOQA.finditer(line):
                    for code in re.findall(r"[A-Z]+[0-9]+", match.group(1)):
                        if family_of(code) not in selected:
                            found.append(f"{path.relative_to(REPO)}:{number}: {code}")
    return found


@pytest.mark.slow
def test_ruff_check_passes():
    ruff = ruff_executable()
    if ruff is None:
        pytest.skip("ruff is not installed in this environment (make test installs it)")
    result = subprocess.run([ruff, "check", "--output-format", "concise", *LINTED], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


def test_noqa_names_only_selected_rules():
    selected = selected_families()
    assert {"E", "F"} <= selected  # the parse found the list it checks against
    found = noqa_codes_outside(selected)
    assert not found, "drop these codes from their noqa comments (keep the reason as a plain comment):\n" + "\n".join(found)


def test_the_noqa_scan_sees_codes_of_unselected_families():
    """The scan itself: a code of an unselected family is reported, a selected one is not."""
    assert family_of("ANN001") == "ANN" and family_of("UP007") == "UP" and family_of("E402") == "E"
    line = "x = f()  # no" + "qa: E402, BLE001 - why"  # split, so that the scan of this file does not see it
    codes = re.findall(r"[A-Z]+[0-9]+", NOQA.search(line).group(1))
    assert codes == ["E402", "BLE001"]
    assert [c for c in codes if family_of(c) not in {"E", "F", "W", "I", "B", "UP"}] == ["BLE001"]
