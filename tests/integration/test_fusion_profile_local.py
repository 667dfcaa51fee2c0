"""The profiler measures fused groups on the local provider (``profile(max_fused=...)``): the
profile it writes carries ``fused_iter_latency_s`` and loads."""

import pytest
import yaml

import rubberband as rb
from rubberband.profiler import profile

from .conftest import ROOT, trainer

pytestmark = pytest.mark.integration


def test_profile_measures_fused_groups_and_writes_keys_that_load(tmp_path):
    data = yaml.safe_load((ROOT / "experiments" / "demo.yaml").read_text())
    data["model_profile"] = str(ROOT / "profiles" / "demo_digits_local.yaml")
    data["cloud"]["profile"] = str(ROOT / "cloud_profiles" / "local" / "local.yaml")
    data["trainer"] = trainer("Tiny")
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    lines: list[str] = []
    result = profile(path, gpus=[1], iters=2, repeats=1, out=tmp_path / "tiny.yaml", runs_dir=tmp_path / "runs",
                     max_packing=1, max_fused=4, on_progress=lines.append)
    model = rb.ModelProfile.load(result.out)
    fusion = model.extra["profiling"]["fusion"]
    sizes = sorted(fusion["samples"])
    assert sizes[0] == 1 and set(model.fused_iter_latency_s) == set(sizes) and max(sizes) <= 4
    assert all(len(fusion["samples"][F]) == 2 for F in sizes)           # iters = 2 group iterations each
    assert fusion["forward"] == "batched" and fusion["optimizer"] == "FusedSGD" and fusion["stopped"]
    assert fusion["scaled_by"] > 0 and set(fusion["throughput_vs_alone"]) == set(sizes)
    if len(sizes) >= 2:
        assert set(model.fused_memory_gb) == set(sizes) and "memory_fit" in fusion
    assert any(line.startswith("fusion 1 trial(s) in one program") for line in lines)
    assert any(line.startswith("fusion stopped:") for line in lines)
    print("\n" + "\n".join(line for line in lines if line.startswith("fusion")))
