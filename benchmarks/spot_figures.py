"""Cost against deadline on spot: on-demand optimum, all-spot optimum, and the per-stage mix.

Two jobs, each planned at confidence 0.95 (P(JCT <= deadline) >= 0.95 in full simulation with
reclaims) with spot at 30% of the on-demand price and 0.3 reclaims per instance-hour, a 120 s
notice (DESIGN §4.1):

- the Figure 12 setting: SHA(512, 4, 4096, 2) of ResNet-50 on p3.8xlarge
  (``experiments/resnet50_sha512.yaml``), deadlines 90..160 minutes;
- the paper's end-to-end job: SHA(32, 1, 50, 3) of ResNet-101 on p3.8xlarge
  (``experiments/resnet101_cifar10.yaml``), deadlines 15..40 minutes.

Writes ``docs/figures/spot_cost_vs_deadline.png`` and ``docs/figures/spot.md`` (the numbers).
Run: ``.venv/bin/python benchmarks/spot_figures.py [--samples 100]`` (a few minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rubberband import load_experiment
from rubberband.errors import InfeasibleDeadlineError
from rubberband.plan import compile_plan
from rubberband.plan.compile import market_label
from rubberband.profiles.cloud import Market
from rubberband.profiles.spot import SpotMarket

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "figures"
MARKETS = (("on-demand optimum", Market.ON_DEMAND), ("all-spot optimum", Market.SPOT), ("auto (per-stage mix)", "auto"))
JOBS = (("Figure 12 setting: SHA(512,4,4096,2) ResNet-50", "resnet50_sha512.yaml", range(90, 161, 10)),
        ("ResNet-101 SHA(32,1,50,3)", "resnet101_cifar10.yaml", range(15, 41, 5)))


def sweep(path: str, minutes, samples: int) -> list[dict]:
    exp = load_experiment(ROOT / "experiments" / path)
    base = exp.cloud_for(exp.instance_type)
    base = base.replace(spot_price_usd_per_hour=0.3 * base.price_usd_per_hour,
                        spot=SpotMarket(notice_s=120, rate_per_hour=0.3))
    rows = []
    for m in minutes:
        row = {"deadline_min": m}
        for label, market in MARKETS:
            cloud = base if market == "auto" else base.replace(market=market)
            try:
                plan = compile_plan(exp.spec, exp.model, cloud, m * 60.0, samples=samples, confidence=0.95,
                                    market="auto" if market == "auto" else market)
                row[label] = (plan.predicted.mean_cost_usd, plan.predicted.p_meet(m * 60.0), market_label(plan))
            except InfeasibleDeadlineError:
                row[label] = None
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=100)
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    md = ["# Cost against deadline on spot instances", "",
          "Regenerate with `.venv/bin/python benchmarks/spot_figures.py` (see its docstring for the set-up: "
          "confidence 0.95, spot at 30% of the on-demand price, 0.3 reclaims per instance-hour, 120 s notice). "
          "Mean cost of the cheapest plan; `x` = cheaper than the on-demand optimum by that factor.", ""]
    for ax, (title, path, minutes) in zip(axes, JOBS):
        t0 = time.perf_counter()
        rows = sweep(path, minutes, args.samples)
        print(f"{title}: {time.perf_counter() - t0:.0f} s")
        md += [f"## {title}", "", "| deadline | " + " | ".join(label for label, _ in MARKETS) + " | auto plan |",
               "|---|" + "---|" * (len(MARKETS) + 1)]
        for row in rows:
            od = row[MARKETS[0][0]]
            cells = []
            for label, _ in MARKETS:
                v = row[label]
                cells.append("infeasible" if v is None else f"${v[0]:,.2f}"
                             + (f" ({od[0] / v[0]:.2f}x)" if od and label != MARKETS[0][0] else ""))
            auto = row[MARKETS[2][0]]
            md.append(f"| {row['deadline_min']} min | " + " | ".join(cells) + f" | {auto[2] if auto else '-'} |")
            print("  ", row["deadline_min"], cells)
        md.append("")
        for label, _ in MARKETS:
            ax.plot([r["deadline_min"] for r in rows], [r[label][0] if r[label] else float("nan") for r in rows],
                    marker="o", label=label, linestyle="--" if label.startswith("auto") else "-")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("deadline (min)")
        ax.set_ylabel("mean cost (USD), P(meet) >= 0.95")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(OUT / "spot_cost_vs_deadline.png", dpi=110)
    (OUT / "spot.md").write_text("\n".join(md) + "\n")
    print(f"wrote {OUT / 'spot_cost_vs_deadline.png'} and {OUT / 'spot.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
