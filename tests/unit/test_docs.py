"""The written-down model stays true to the code: every function DESIGN.md and docs/ cite
exists, and every "DESIGN §N" the code cites is a section of DESIGN.md."""

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "DESIGN.md", *sorted((ROOT / "docs").glob("*.md"))]
# `simulator/spot.py: PositionSchedule._fill` or `rubberband/executor/run.py` (paths under rubberband/)
CITATION = re.compile(r"`((?:rubberband/)?[\w/]+\.py)(?::\s*([\w.]+))?`")


@cache
def _defined(path: Path) -> set[str]:
    """Names a module defines: top-level functions, classes and assignments, and ``Class.member``."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                names.update(f"{node.name}.{m.name}" for m in node.body
                             if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def _citations(doc: Path) -> list[tuple[str, str | None]]:
    return [(m.group(1), m.group(2)) for m in CITATION.finditer(doc.read_text())]


def _resolve(path: str) -> Path:
    for candidate in (ROOT / path, ROOT / "rubberband" / path):
        if candidate.is_file():
            return candidate
    return ROOT / "rubberband" / path


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_every_cited_module_and_name_exists(doc):
    missing = []
    for path, name in _citations(doc):
        file = _resolve(path)
        if not file.is_file():
            missing.append(f"{path} (no such file)")
        elif name is not None and name not in _defined(file):
            missing.append(f"{path}: {name} (not defined there)")
    assert missing == [], f"{doc.name} cites what the code no longer has; update the citation"


def test_design_cites_the_rules_an_outside_check_found():
    """The two rules that were only in the code: a trace market ignores the notice, and an
    instance whose capacity vanished during its SCALE never ran."""
    text = (ROOT / "DESIGN.md").read_text()
    assert "A trace market ignores `notice_s`" in text
    assert "vanishes during its SCALE never ran" in text


def _sections() -> set[str]:
    heads = re.findall(r"^#{2,3} (\d+(?:\.\d+)*)\.?\s", (ROOT / "DESIGN.md").read_text(), re.MULTILINE)
    return set(heads)


def test_every_design_section_the_code_cites_exists():
    sections = _sections()
    assert {"3", "4", "4.1", "5", "6"} <= sections
    cited = re.compile(r"DESIGN(?:\.md)?\s*§\s*(\d+(?:\.\d+)*)((?:\s*(?:,|and|or)\s*§?\s*\d+(?:\.\d+)*)*)")
    wrong = []
    files = [p for folder in ("rubberband", "tests", "benchmarks", "scripts", "cloud_profiles", "docs")
             for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".md", ".yaml")] + [ROOT / "README.md"]
    for file in files:
        for m in cited.finditer(file.read_text()):
            numbers = [m.group(1), *re.findall(r"\d+(?:\.\d+)*", m.group(2))]
            wrong += [f"{file.relative_to(ROOT)}: §{n}" for n in numbers if n not in sections]
    assert wrong == [], "these cite a DESIGN.md section that does not exist"


def test_the_profile_shapes_in_design_load():
    import yaml

    from rubberband.profiles.cloud import CloudProfile
    from rubberband.profiles.model import ModelProfile

    blocks = [yaml.safe_load(b) for b in re.findall(r"^```yaml\n(.*?)^```", (ROOT / "DESIGN.md").read_text(),
                                                    re.MULTILINE | re.DOTALL)]
    models = [ModelProfile.from_dict(b) for b in blocks if "iter_latency_s" in b]
    clouds = [CloudProfile.from_dict(b) for b in blocks if "gpus_per_instance" in b]
    assert len(models) == 1 and len(clouds) == 1
    assert models[0].latency(4).mean == pytest.approx((2.2 + 0.7) / 2)       # log2-interpolated between 2 and 8
    assert clouds[0].spot.rate_per_hour == 0.3 and clouds[0].G == 4


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_mermaid_diagrams_have_no_statement_breaks_in_their_text(doc):
    """Mermaid ends a statement at ``;``: one inside a message or a note cuts the diagram."""
    blocks = re.findall(r"^```mermaid\n(.*?)^```", doc.read_text(), re.MULTILINE | re.DOTALL)
    assert [line for b in blocks for line in b.splitlines() if ";" in line] == []
