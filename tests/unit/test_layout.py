"""The pure core (spec, profiles, simulate, plan, place) never imports ray, boto3 or torch."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE = ["spec", "profiles", "simulator", "plan", "placement", "scheduler"]
HEAVY = ("ray", "torch", "boto3", "botocore")


@pytest.mark.parametrize("package", PURE)
def test_pure_package_sources_do_not_import_sdks(package):
    pattern = re.compile(r"^\s*(import|from)\s+(ray|torch|boto3|botocore)\b", re.MULTILINE)
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "rubberband" / package).rglob("*.py")
                 if pattern.search(p.read_text())]
    assert offenders == []


def test_importing_the_core_and_the_cli_loads_no_sdk():
    code = ("import sys, rubberband, rubberband.config, rubberband.cli.main\n"
            + "".join(f"import rubberband.{p}\n" for p in PURE)
            + f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


# --- the import direction between packages ---------------------------------------------------
# Pipeline order of the pure core: each may import only the neutral modules and the packages
# before it. Everything above the core (config, providers, executor, profiler, testing) may
# import the core, and nothing but the CLI itself imports the CLI.
NEUTRAL = {"errors", "units", "schema", "render", "limits"}
CORE_ORDER = ["spec", "profiles", "simulator", "plan", "placement", "scheduler"]


def _package_imports() -> dict[str, set[str]]:
    """Top-level package (or module) of ``rubberband`` -> the ones it imports, lazily or not."""
    import ast

    edges: dict[str, set[str]] = {}
    for path in (ROOT / "rubberband").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        source = parts[1] if len(parts) > 1 else "<root>"
        targets = edges.setdefault(source, set())
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                bits = name.split(".")
                if bits[0] == "rubberband":
                    targets.add(bits[1] if len(bits) > 1 else "<root>")
        targets.discard(source)
    return edges


def test_the_pure_core_imports_only_what_comes_before_it():
    edges = _package_imports()
    for i, package in enumerate(CORE_ORDER):
        allowed = NEUTRAL | set(CORE_ORDER[:i])
        assert edges[package] <= allowed, f"{package} imports {sorted(edges[package] - allowed)}"
    for name in NEUTRAL:
        assert edges.get(name, set()) <= NEUTRAL, f"{name} imports {sorted(edges[name] - NEUTRAL)}"


def test_nothing_outside_the_cli_imports_it():
    edges = _package_imports()
    offenders = sorted(p for p, targets in edges.items() if "cli" in targets and p not in ("cli", "__main__"))
    assert offenders == []


def test_packages_import_each_other_without_cycles():
    edges = _package_imports()
    edges.pop("<root>", None)          # the package's lazy re-exports of the public API
    for package in edges:
        edges[package].discard("<root>")   # `from rubberband import __version__`
    seen: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        if seen.get(node) == 1:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(node):] + [node]))
        if seen.get(node) == 2:
            return
        seen[node] = 1
        for nxt in sorted(edges.get(node, ())):
            visit(nxt, path + [node])
        seen[node] = 2

    for package in sorted(edges):
        visit(package, [])


# --- the README's Layout names every package and top-level module ---------------------------
def _readme_layout() -> str:
    text = (ROOT / "README.md").read_text()
    section = re.search(r"^## Layout\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert section, "README.md has no `## Layout` section"
    return section.group(1)


def test_readme_layout_lists_every_package():
    packages = sorted(p.parent.name for p in (ROOT / "rubberband").glob("*/__init__.py"))
    listed = set(re.findall(r"^rubberband/(\w+)\s", _readme_layout(), re.MULTILINE))
    assert [p for p in packages if p not in listed] == [], "add the package to README.md's Layout"
    assert sorted(listed) == packages, "README.md's Layout lists a package that is not there"


def test_readme_layout_lists_every_top_level_module():
    modules = sorted(p.name for p in (ROOT / "rubberband").glob("*.py") if p.name != "__init__.py")
    entry = re.search(r"^rubberband/\*\.py\s(.*?)(?=^\S)", _readme_layout(), re.MULTILINE | re.DOTALL)
    assert entry, "README.md's Layout has no `rubberband/*.py` entry for the top-level modules"
    listed = set(re.findall(r"\b(\w+\.py)\b", entry.group(1)))
    assert [m for m in modules if m not in listed] == [], "add the module to README.md's Layout (rubberband/*.py)"
