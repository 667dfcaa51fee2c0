#!/usr/bin/env python
"""Derive the compact spot availability traces rubberband ships from the raw AWS V100 traces.

The raw data (``shared/data/spot-traces-aws-v100``: Can't Be Late, NSDI '24, redistributed by
the SkyNomad artifact under the Apache License 2.0) probes every ~195 s (one p3.2xlarge) or
every 300 s (gangs of 4 and 16). Availability is a step function between probes, so only the
probes where the value changes need keeping: each trace becomes change points
``[seconds since the trace's start, value]`` and a total duration. Values are how many of the
trace's ``nodes`` instances were available (0 or 1 for single-instance traces).

Writes ``cloud_profiles/aws/spot_traces/p3.2xlarge.json`` and copies the licence and notice
beside it. Usage: python scripts/derive_spot_traces.py [RAW_DIR] [OUT_DIR]
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RAW = ROOT.parent / "shared" / "data" / "spot-traces-aws-v100"
OUT = ROOT / "cloud_profiles" / "aws" / "spot_traces"


def _changes(times: list[float], values: list[int], period_s: float) -> dict:
    """Run-length encode a probed step function; it lasts one probe period past the last probe."""
    t0 = times[0]
    changes = [[0.0, values[0]]]
    for t, v in zip(times[1:], values[1:]):
        if v != changes[-1][1]:
            changes.append([round(t - t0, 1), v])
    return {"duration_s": round(times[-1] - t0 + period_s, 1), "changes": changes}


def single_node(path: Path) -> dict:
    rows = list(csv.DictReader(path.open()))
    stamps = [dt.datetime.fromisoformat(r["date"]).replace(tzinfo=dt.UTC) for r in rows]
    times = [s.timestamp() for s in stamps]
    gaps = sorted(b - a for a, b in zip(times, times[1:]))
    period = gaps[len(gaps) // 2]
    return {"zone": path.name.split("_")[0], "nodes": 1, "start": stamps[0].isoformat().replace("+00:00", "Z"),
            "probe_s": period, **_changes(times, [int(r["availability"]) for r in rows], period)}


def gang(path: Path, nodes: int) -> dict:
    raw = json.loads(path.read_text())
    period = float(raw["metadata"]["gap_seconds"])
    values = [int(v) for v in raw["data"]]
    return {"zone": path.name.split("_")[0], "nodes": nodes, "start": None, "probe_s": period,
            **_changes([i * period for i in range(len(values))], values, period)}


def main(argv: list[str]) -> int:
    raw = Path(argv[0]) if argv else RAW
    out = Path(argv[1]) if len(argv) > 1 else OUT
    if not raw.is_dir():
        print(f"error: no raw traces at {raw}; pass the folder of spot-traces-aws-v100", file=sys.stderr)
        return 2
    traces = [single_node(p) for p in sorted((raw / "availability-1node").glob("*.csv"))]
    for nodes in (4, 16):
        traces += [gang(p, nodes) for p in sorted((raw / f"availability-{nodes}node").glob("*.json"))]
    doc = {
        "source": "spot-traces-aws-v100: AWS p3.2xlarge (V100) spot availability, 2023-02-15 to 2023-04-02, "
                  "from Can't Be Late (NSDI '24) as redistributed by the SkyNomad artifact; Apache License 2.0 "
                  "(LICENSE and NOTICE beside this file). Derived by scripts/derive_spot_traces.py: "
                  "only the probes where availability changes are kept.",
        "instance_type": "p3.2xlarge",
        "traces": traces,
    }
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, separators=(",", ":"))
    (out / "p3.2xlarge.json").write_text(text + "\n")
    for name in ("LICENSE", "NOTICE"):
        shutil.copyfile(raw / name, out / name)
    print(f"wrote {out / 'p3.2xlarge.json'}: {len(traces)} traces, {len(text) / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
