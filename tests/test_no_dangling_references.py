"""Nothing in the repository points at something that is not in it.

A reader of olingo's code, tests, docs and benchmarks can follow every pointer: citations go to
`docs/` pages, papers or upstream code, never to design notes that live outside the repository
(`REFERENCE.md`, `DESIGN.md`, a `shared/` or `seeds/` folder) or to labels from the project's
history ("seed 004", "issue 19", reference-section labels like "E3.2"). Every repository path a
file names (`docs/engines.md`, `olingo/trainer/ppo.py`, ...) and every relative Markdown link
must exist, so a moved module or page cannot leave a stale pointer behind.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCANNED = ["olingo", "tests", "bench", "docs", "README.md", "Makefile", "pyproject.toml"]
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".ini", ".sh", ".json", ".csv", ""}

# Pointers to documents outside the repository, and labels that only our history explains.
DANGLING = {
    "a design note outside the repository": re.compile(r"REFERENCE\.md|\bDESIGN\b|\.\./shared|\bshared/|\bseeds/"),
    "a section sign of an outside document": re.compile(r"§\s*\d"),
    "a seed label": re.compile(r"\b[Ss]eed[- ]0\d\d\b|\b[Ss]eed'?s? (?:example|usage|API|constructor|keywords?)\b"),
    "an issue label": re.compile(r"\b[Ii]ssue #?\d+\b"),
    "a reference-section label": re.compile(r"\b[A-F][1-9]\.\d+\b"),
}
REPO_PATH = re.compile(r"(?<![\w/.-])((?:olingo|tests|bench|docs)/[\w./-]*\w\.(?:py|md|yaml|yml|toml|json))\b")
MD_LINK = re.compile(r"\]\(([^)#\s]*\.md|)(?:#([^)\s]+))?\)")


def scanned_files() -> list[Path]:
    """Every text file under the scanned roots except this test (which spells the patterns)."""
    files = []
    for root in SCANNED:
        path = REPO / root
        candidates = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for candidate in candidates:
            parts = candidate.relative_to(REPO).parts
            if "__pycache__" in parts or any(part.startswith(".") for part in parts):
                continue
            if candidate.suffix in TEXT_SUFFIXES and candidate.resolve() != Path(__file__).resolve():
                files.append(candidate)
    return files


def heading_anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of Markdown file `path` (lower case, punctuation
    dropped, spaces to hyphens, `-1`, `-2` for repeats), fenced code left out."""
    anchors, seen, fenced = set(), {}, False
    for line in path.read_text(encoding="utf-8").splitlines():
        fenced ^= line.startswith("```")
        if fenced or not (heading := re.match(r"#{1,6}\s+(.*)", line)):
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def numbered_lines(path: Path) -> list[tuple[str, int, str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:  # a binary file with a text-like name: nothing to read
        return []
    where = str(path.relative_to(REPO))
    return [(where, number, line) for number, line in enumerate(text.splitlines(), start=1)]


def dangling_labels(lines: list[tuple[str, int, str]]) -> list[str]:
    """'file:line: what (the text)' for every pointer to an outside document or history label."""
    return [
        f"{where}:{number}: {what} ({match.group(0)!r})"
        for where, number, line in lines
        for what, pattern in DANGLING.items()
        for match in pattern.finditer(line)
    ]


def missing_paths(lines: list[tuple[str, int, str]]) -> list[str]:
    """'file:line: ...' for every repository path or relative Markdown link that does not exist."""
    found = []
    for where, number, line in lines:
        for match in REPO_PATH.finditer(line):
            if not (REPO / match.group(1)).exists():
                found.append(f"{where}:{number}: names {match.group(1)}, which is not in the repository")
        if where.endswith(".md"):
            for match in MD_LINK.finditer(line):
                target, anchor = match.group(1), match.group(2)
                page = (REPO / where).parent / target if target else REPO / where
                if target and not page.exists():
                    found.append(f"{where}:{number}: links {target}, which is not in the repository")
                elif anchor and page.suffix == ".md" and anchor not in heading_anchors(page):
                    found.append(f"{where}:{number}: links {target}#{anchor}, a heading {target or where} does not have")
    return found


@pytest.fixture(scope="module")
def lines() -> list[tuple[str, int, str]]:
    return [entry for path in scanned_files() for entry in numbered_lines(path)]


def test_the_scan_reads_the_code_the_docs_and_the_benchmarks(lines):
    read = {where for where, _, _ in lines}
    assert {"README.md", "docs/coming-from-colossalchat.md", "olingo/trainer/ppo.py", "bench/README.md"} <= read
    assert "tests/test_no_dangling_references.py" not in read


def test_no_file_cites_an_outside_document_or_a_history_label(lines):
    found = dangling_labels(lines)
    assert not found, "pointers to documents not in the repository (cite a docs/ page, a paper or upstream code):\n" + "\n".join(found)


def test_every_named_repository_path_and_markdown_link_exists(lines):
    found = missing_paths(lines)
    assert not found, "pointers to files not in the repository:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "line",
    [
        "The loop, as the hooks see it (REFERENCE.md A1):",
        "Layout (DESIGN.md §4.1): sequences",
        "see DESIGN §5",
        "PPO trainer with seed 004's constructor",
        "The seed-003 usage, with olingo imports:",
        "# --- the seed's usage example ---",
        "fixed in issue 19",
        '"""E3.3: ColossalChat saved at (step + 1)"""',
        "read ../shared/notes.md",
    ],
)
def test_the_patterns_catch_each_kind_of_dangling_pointer(line):
    assert dangling_labels([("x.py", 1, line)])


@pytest.mark.parametrize(
    "line",
    [
        "seed_everything(42)  # one seed per run",
        "REFERENCE_FREE = ('simpo',)",
        "shuffled in the seed's order; seeds 42 and 43",
        "weight sync hanging without an error (TRL #6796)",
        "see docs/coming-from-colossalchat.md and Yao et al. 2025",
        "A1 = 0.1 + 0.95 * 0.3 = 0.385",
    ],
)
def test_the_patterns_leave_ordinary_text_alone(line):
    assert not dangling_labels([("x.py", 1, line)])


def test_a_moved_module_or_page_is_reported_with_its_file_and_line():
    lines = [
        ("docs/x.md", 3, "the loss in `olingo/models/no_such_module.py`, see [p](no-such-page.md#top)"),
        ("docs/x.md", 4, "[the loss](algorithms.md#the-loss-loss), [gone](algorithms.md#no-such-heading)"),
    ]
    assert missing_paths(lines) == [
        "docs/x.md:3: names olingo/models/no_such_module.py, which is not in the repository",
        "docs/x.md:3: links no-such-page.md, which is not in the repository",
        "docs/x.md:4: links algorithms.md#no-such-heading, a heading algorithms.md does not have",
    ]


# ---- docs/coming-from-colossalchat.md names only what exists, with the signatures the code has ----
COMPAT_PAGE = REPO / "docs" / "coming-from-colossalchat.md"
SIGNATURE_ROW = re.compile(r"^\| `(\w+)` \| `\(([^`]*)\)`", re.M)
CLASS_HOMES = {
    "DetachedTrainer": "olingo.ray.detached_trainer_base",
    "ExperienceMakerHolder": "olingo.ray.experience_maker_holder",
}


def module_file(dotted: str) -> Path | None:
    """The source file of module `dotted` (a package's `__init__.py`), or None."""
    base = REPO.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def defines(source: Path, name: str) -> bool:
    """Whether module `source` defines, imports or lazily exports (a string key) `name`."""
    import ast

    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name:
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name.split(".")[-1]) == name for a in node.names):
            return True
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id == name:
            return True
        if isinstance(node, ast.Constant) and node.value == name:
            return True
    return False


def unresolved_names(text: str) -> list[str]:
    """Every backticked `olingo.x.y` in `text` that names no module and no name in its module."""
    missing = []
    for dotted in sorted(set(re.findall(r"`(olingo(?:\.\w+)+)`", text))):
        if module_file(dotted) is not None:
            continue
        module, _, name = dotted.rpartition(".")
        source = module_file(module)
        if source is None or not defines(source, name):
            missing.append(dotted)
    return missing


def split_parameters(text: str) -> list[str]:
    """'a, b=(1, 2), **kw' -> ['a', 'b=(1, 2)', '**kw'] (commas inside brackets stay)."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char in "([{"
        depth -= char in ")]}"
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    return [*parts, current.strip()] if current.strip() else parts


def test_every_olingo_name_on_the_compatibility_page_exists():
    assert unresolved_names(COMPAT_PAGE.read_text()) == []
    assert unresolved_names("`olingo.trainer.PPOTrainer`, `olingo.no_such.Thing`, `olingo.trainer.NoSuchTrainer`") == [
        "olingo.no_such.Thing", "olingo.trainer.NoSuchTrainer",
    ]


def documented_signatures() -> dict[str, list[str]]:
    return {name: split_parameters(params) for name, params in SIGNATURE_ROW.findall(COMPAT_PAGE.read_text())}


def test_the_page_documents_every_compatible_class():
    assert set(documented_signatures()) == {
        "SFTTrainer", "RewardModelTrainer", "PPOTrainer", "GRPOTrainer", "DPOTrainer", "ORPOTrainer", "KTOTrainer",
        "DetachedTrainer", "ExperienceMakerHolder",
    }


@pytest.mark.parametrize(
    "name",
    [
        *("SFTTrainer", "RewardModelTrainer", "PPOTrainer", "GRPOTrainer", "DPOTrainer", "ORPOTrainer", "KTOTrainer"),
        pytest.param("DetachedTrainer", marks=pytest.mark.slow),  # importing ray takes seconds
        pytest.param("ExperienceMakerHolder", marks=pytest.mark.slow),
    ],
)
def test_the_page_signatures_are_the_code_s(name):
    """The ColossalChat-compatible parameters, in order and with the defaults the page gives."""
    import ast
    import importlib
    import inspect

    cls = getattr(importlib.import_module(CLASS_HOMES.get(name, "olingo.trainer")), name)
    cls = getattr(getattr(cls, "__ray_metadata__", None), "modified_class", cls)  # a @ray.remote actor class
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    positional = [p for p in parameters if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    documented = documented_signatures()[name]
    kwargs = [p.name for p in parameters if p.kind is inspect.Parameter.VAR_KEYWORD]
    assert [d.split("=")[0] for d in documented] == [p.name for p in positional] + [f"**{k}" for k in kwargs]
    for entry, parameter in zip(documented, positional, strict=False):
        if "=" in entry:
            assert ast.literal_eval(entry.split("=", 1)[1]) == parameter.default, entry
