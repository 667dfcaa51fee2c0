"""`--model-profile` / `--cloud-overrides`: plan, simulate and run with what `rubberband profile` measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import rubberband.cli.run_cmd  # noqa: F401  registers `run`
from rubberband.cli.main import main

ROOT = Path(__file__).resolve().parents[3]
DEMO = str(ROOT / "experiments" / "demo.yaml")
SIMULATE = ["simulate", DEMO, "--allocation", "2,2,2,2,1", "--samples", "200", "--json"]


def _measured(tmp_path: Path) -> tuple[Path, Path]:
    """A model profile twice as slow per iteration as the shipped one, and a 100 s init latency."""
    model = yaml.safe_load((ROOT / "profiles" / "demo_digits_local.yaml").read_text())
    model["iter_latency_s"] = {g: {"dist": "constant", "value": 2 * d["mean"]} for g, d in model["iter_latency_s"].items()}
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(model))
    (tmp_path / "m.cloud.yaml").write_text(yaml.safe_dump({"init_latency_s": {"dist": "constant", "value": 100.0}}))
    return tmp_path / "m.yaml", tmp_path / "m.cloud.yaml"


def _mean_jct(capsys, *extra: str) -> float:
    assert main([*SIMULATE, *extra]) == 0
    return json.loads(capsys.readouterr().out)["jct_s_mean"]


def test_simulate_uses_the_measured_files(tmp_path, capsys):
    model, cloud = _measured(tmp_path)
    shipped = _mean_jct(capsys)
    slower = _mean_jct(capsys, "--model-profile", str(model))
    later = _mean_jct(capsys, "--cloud-overrides", str(cloud))
    assert slower > shipped + 20                 # ~30 s of the ~49 s are iterations, which take twice as long
    assert later == pytest.approx(shipped + 100 - 11.47, abs=1)   # one launch: 100 s instead of the shipped 11.5 s


def test_plan_uses_the_measured_files(tmp_path, capsys):
    model, _ = _measured(tmp_path)
    assert main(["plan", DEMO, "--deadline", "1h", "--samples", "100", "--json"]) == 0
    shipped = json.loads(capsys.readouterr().out)["predicted"]["jct_s_mean"]
    assert main(["plan", DEMO, "--deadline", "1h", "--samples", "100", "--json", "--model-profile", str(model)]) == 0
    assert json.loads(capsys.readouterr().out)["predicted"]["jct_s_mean"] > shipped + 20


@pytest.mark.parametrize("command", ["plan", "simulate", "run"])
@pytest.mark.parametrize("flag, content, needle", [
    ("--model-profile", None, "--model-profile: no such file"),
    ("--model-profile", "name: x\n", "iter_latency_s"),
    ("--cloud-overrides", None, "--cloud-overrides: no such file"),
    ("--cloud-overrides", "init_latncy_s: {dist: constant, value: 1}\n", "did you mean `init_latency_s`"),
    ("--cloud-overrides", "price_usd_per_hour: -1\n", "--cloud-overrides "),
])
def test_a_bad_measured_file_is_one_line_naming_it(tmp_path, capsys, command, flag, content, needle):
    path = tmp_path / "f.yaml"
    if content is not None:
        path.write_text(content)
    extra = ["--allocation", "2,2,2,2,1"] if command == "simulate" else []
    assert main([command, DEMO, *extra, flag, str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err
