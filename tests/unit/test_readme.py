"""The README's Python example runs as written, and `rb.<name>` is always the function or class
it names, whatever was imported before it (a subpackage of the same name would shadow it)."""

import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _readme_python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), re.MULTILINE | re.DOTALL)


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_readme_has_one_python_block():
    assert len(_readme_python_blocks()) == 1


def test_readme_python_block_runs_verbatim():
    out = _run(_readme_python_blocks()[0])
    assert out.returncode == 0, out.stderr


# The orders a user may import things in: a subpackage first, a name that loads a heavy
# subpackage first, or every module of the package first.
PRELUDES = {
    "engine module first": "import rubberband.simulator.engine\nimport rubberband as rb\n",
    "compile_plan first": "import rubberband as rb\nrb.compile_plan\n",
    "Trainer first": "import rubberband as rb\nrb.Trainer\n",
    "every module first": "import rubberband as rb\nimport importlib\nfor m in MODULES:\n    importlib.import_module(m)\n",
}


def _modules() -> list[str]:
    """Every module of the package, except the CLI entry points and the SDK-bound ones that
    need optional dependencies at import time."""
    import rubberband

    names = [m.name for m in pkgutil.walk_packages(rubberband.__path__, "rubberband.")]
    return [n for n in names if not n.endswith("__main__")]


@pytest.mark.parametrize("prelude", PRELUDES, ids=list(PRELUDES))
def test_every_exported_name_is_the_function_or_class_not_a_module(prelude):
    check = (
        "import types\n"
        "bad = {n: repr(getattr(rb, n)) for n in rb.__all__ if n != '__version__'\n"
        "       if isinstance(getattr(rb, n), types.ModuleType) or getattr(getattr(rb, n), '__name__', n) != n}\n"
        "assert not bad, bad\n"
        "assert callable(rb.simulate) and callable(rb.execute) and callable(rb.profile) and callable(rb.place)\n"
    )
    out = _run(f"MODULES = {_modules()!r}\n" + PRELUDES[prelude] + check)
    assert out.returncode == 0, out.stderr


def test_readme_python_block_plans_the_experiment_as_the_cli_does():
    # issue 21: the block built the cloud from the catalog alone, without the experiment's
    # `cloud.overrides` (15 s INIT, 0.15 GB dataset), so it planned another job than `plan` does.
    from rubberband import load_experiment

    code = _readme_python_blocks()[0] + "\nimport json\nprint(json.dumps({'cloud': cloud.to_dict(), " \
                                        "'allocation': list(plan.allocation)}))\n"
    out = _run(code)
    assert out.returncode == 0, out.stderr
    import json

    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["cloud"] == json.loads(json.dumps(load_experiment(ROOT / "experiments" / "resnet101_cifar10.yaml")
                                                 .cloud.to_dict()))


def _commands() -> list[str]:
    """Every `rubberband ...` command line of the README's plain code blocks, without its comment."""
    out, fence = [], None
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("```"):
            fence = None if fence is not None else line[3:].strip()
        elif fence == "" and line.startswith("rubberband "):
            out.append(line.split("  #")[0].strip())
    return out


def test_every_file_a_readme_command_names_is_shipped():
    # issue 21: `--truth-model slow.yaml` named no file of the repository.
    named = {tok for cmd in _commands() for tok in cmd.split() if tok.endswith((".yaml", ".json"))}
    missing = [p for p in named if not p.startswith("runs/") and p not in ("plan.json",) and not (ROOT / p).is_file()]
    assert named and not missing, missing


def test_the_readmes_exit_code_3_example_exits_3(capsys):
    # issue 21: `run ... --provider sim --budget 8` exits 2 (no plan fits $8), not 3 as the README said.
    import os

    from rubberband.cli.main import main

    (line,) = [line for line in (ROOT / "README.md").read_text().splitlines() if "exit code 3" in line
               and line.startswith("rubberband ")]
    argv = line.split("  #")[0].split()[1:]
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        assert main([*argv, "--samples", "50"]) == 3, capsys.readouterr().err
    finally:
        os.chdir(cwd)
