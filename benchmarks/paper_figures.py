"""Regenerate the RubberBand paper's simulated Figures 9-12 from the example profiles.

Run from the repository root:

    .venv/bin/python benchmarks/paper_figures.py

It writes one PNG per figure and ``README.md`` (the numbers behind every plot) into
``docs/figures/``. Every point is the mean cost of the cheapest plan each policy finds
(``rubberband.plan.whatif``), static being the paper's fixed-cluster baseline and optimal
the elastic planner; plans share common random numbers (one seed).

- Fig. 9: stragglers. SHA(64, 4, 508, 2), ResNet-50 batch 512 (4 s per iteration on one GPU),
  init latency 0, 20-minute deadline; the std of the iteration latency at one GPU swept from
  1 to 10 s, per-instance vs per-function billing.
- Fig. 10: data price 0..0.16 USD/GB for ImageNet (150 GB) and CIFAR-10 (0.15 GB), same job.
- Fig. 11: number of trials, SHA(k, 4, 508, 2), 20-minute deadline, both billing models.
- Fig. 12: SHA(512, 4, 4096, 2), ResNet-50 batch 2048, init latency 1/10/100 s, deadline
  90..160 minutes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rubberband import load_experiment  # noqa: E402
from rubberband.plan import saving, whatif  # noqa: E402

POLICIES = ["static", "optimal"]
OUT = ROOT / "docs" / "figures"
COMMAND = ".venv/bin/python benchmarks/paper_figures.py"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _ratio(scenario) -> str:
    r = saving(scenario)
    return f"{r:.2f}x" if r else "-"


def _usd(value) -> str:
    return "infeasible" if value is None else f"${value:,.2f}"


def _nan(value) -> float:
    return float("nan") if value is None else value


def _md_table(headers: list[str], rows: list[list[object]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


class Timer:
    def __init__(self, label: str):
        self.label = label

    def __enter__(self):
        print(f"{self.label} ...", end="", flush=True)
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0
        print(f" {self.seconds:.1f}s", flush=True)


# --- Figure 9: stragglers ----------------------------------------------------------------------

def fig9(samples: int, seed: int) -> tuple[str, str]:
    """Iteration latency N(4 s, sigma) at one GPU; at g GPUs the std scales with the mean.

    The ``straggler_std`` what-if axis would set the same std at every GPU count, which at 16
    GPUs (mean 0.5 s) is mostly clipped at 0 and changes the mean; scaling keeps each count's
    coefficient of variation what it is at one GPU, as the paper's sweep implies.
    """
    exp = load_experiment(ROOT / "experiments" / "resnet50_sha64.yaml")
    one = exp.model.latency(1).mean
    sigmas = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    rows, series = [], {(b, p): [] for b in ("per_instance", "per_function") for p in POLICIES}
    for sigma in sigmas:
        model = exp.model.replace(iter_latency_s={g: d.with_moments(d.mean, sigma * d.mean / one)
                                                  for g, d in exp.model.iter_latency_s.items()})
        scenarios = whatif(exp.spec, model, exp.cloud, exp.deadline_s, {"billing": ["per_instance", "per_function"]},
                           POLICIES, samples=samples, seed=seed)
        row = [sigma]
        for s in scenarios:
            for p in POLICIES:
                series[(s.values["billing"], p)].append(_nan(s.costs[p]))
            row += [_usd(s.costs["static"]), _usd(s.costs["optimal"]), _ratio(s)]
        rows.append(row)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for (billing, p), ys in series.items():
        ax.plot(sigmas, ys, marker="o", linestyle="-" if billing == "per_instance" else "--",
                label=f"{p} ({billing.replace('_', '-')})")
    ax.set_xlabel("std of seconds per iteration at 1 GPU (mean 4 s)")
    ax.set_ylabel("mean cost (USD)")
    ax.set_title("Fig. 9: stragglers, SHA(64,4,508,2), 20-min deadline")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(OUT / "fig9_stragglers.png", dpi=110)
    plt.close(fig)
    table = _md_table(["std (s)", "static per-instance", "optimal per-instance", "static/optimal",
                       "static per-function", "optimal per-function", "static/optimal"], rows)
    return "fig9_stragglers.png", table


# --- Figure 10: data price ---------------------------------------------------------------------

def fig10(samples: int, seed: int) -> tuple[str, str]:
    exp = load_experiment(ROOT / "experiments" / "resnet50_sha64.yaml")
    prices = [0.0, 0.01, 0.02, 0.04, 0.08, 0.12, 0.16]
    datasets = {"ImageNet (150 GB)": 150.0, "CIFAR-10 (0.15 GB)": 0.15}
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    rows = []
    for ax, (label, gb) in zip(axes, datasets.items()):
        scenarios = whatif(exp.spec, exp.model, exp.cloud, exp.deadline_s,
                           {"dataset_gb": [gb], "data_price_usd_per_gb": prices}, POLICIES, samples=samples, seed=seed)
        for p in POLICIES:
            ax.plot(prices, [_nan(s.costs[p]) for s in scenarios], marker="o", label=p)
        ax.set_title(f"Fig. 10: {label}")
        ax.set_xlabel("data price (USD per GB, per instance launch)")
        ax.set_ylabel("mean cost (USD)")
        ax.grid(alpha=0.3)
        ax.legend()
        for s in scenarios:
            rows.append([label, f"{s.values['data_price_usd_per_gb']:.2f}", _usd(s.costs["static"]),
                         _usd(s.costs["optimal"]), _ratio(s)])
    fig.tight_layout()
    fig.savefig(OUT / "fig10_data_price.png", dpi=110)
    plt.close(fig)
    return "fig10_data_price.png", _md_table(["dataset", "USD/GB", "static", "optimal", "static/optimal"], rows)


# --- Figure 11: number of trials ----------------------------------------------------------------

def fig11(samples: int, seed: int) -> tuple[str, str]:
    exp = load_experiment(ROOT / "experiments" / "resnet50_sha64.yaml")
    trials = [16, 32, 64, 128, 256, 512]
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    by_trials: dict[int, list[object]] = {k: [k] for k in trials}
    for ax, billing in zip(axes, ("per_instance", "per_function")):
        scenarios = whatif(exp.spec, exp.model, exp.cloud, exp.deadline_s, {"num_trials": trials, "billing": [billing]},
                           POLICIES, samples=samples, seed=seed, spec_for_trials=exp.spec_with_trials)
        for p in POLICIES:
            ax.plot(trials, [_nan(s.costs[p]) for s in scenarios], marker="o", label=p)
        ax.set_xscale("log", base=2)
        ax.set_title(f"Fig. 11: {billing.replace('_', '-')} billing")
        ax.set_xlabel("trials (SHA(k,4,508,2), 20-min deadline)")
        ax.set_ylabel("mean cost (USD)")
        ax.grid(alpha=0.3)
        ax.legend()
        for s in scenarios:
            diff = (s.costs["static"] - s.costs["optimal"]) if s.costs["static"] and s.costs["optimal"] else None
            by_trials[s.values["num_trials"]] += [_usd(s.costs["static"]), _usd(s.costs["optimal"]), _ratio(s),
                                                  _usd(diff)]
    fig.tight_layout()
    fig.savefig(OUT / "fig11_trials.png", dpi=110)
    plt.close(fig)
    headers = ["trials"] + [f"{h} {b}" for b in ("per-instance", "per-function")
                            for h in ("static", "optimal", "static/optimal", "saved")]
    return "fig11_trials.png", _md_table(headers, list(by_trials.values()))


# --- Figure 12: init latency × deadline ----------------------------------------------------------

def fig12(samples: int, seed: int) -> tuple[str, str]:
    exp = load_experiment(ROOT / "experiments" / "resnet50_sha512.yaml")
    inits = [1.0, 10.0, 100.0]
    deadlines = [m * 60.0 for m in range(90, 161, 10)]
    scenarios = whatif(exp.spec, exp.model, exp.cloud, exp.deadline_s,
                       {"init_latency_s": inits, "deadline_s": deadlines}, POLICIES, samples=samples, seed=seed)
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2), sharey=True)
    rows = []
    for ax, init in zip(axes, inits):
        mine = [s for s in scenarios if s.values["init_latency_s"] == init]
        for p in POLICIES:
            ax.plot([d / 60 for d in deadlines], [_nan(s.costs[p]) for s in mine], marker="o", label=p)
        ax.set_title(f"Fig. 12: {init:g} s init latency")
        ax.set_xlabel("deadline (min)")
        ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
        ax.legend()
        for s in mine:
            rows.append([f"{init:g}", f"{s.values['deadline_s'] / 60:.0f}", _usd(s.costs["static"]),
                         _usd(s.costs["optimal"]), _ratio(s)])
    axes[0].set_ylabel("mean cost (USD, log scale)")
    fig.tight_layout()
    fig.savefig(OUT / "fig12_init_latency.png", dpi=110)
    plt.close(fig)
    return "fig12_init_latency.png", _md_table(["init (s)", "deadline (min)", "static", "optimal", "static/optimal"],
                                                rows)


FIGURES = [
    ("Figure 9 — stragglers (per-instance vs per-function billing)", fig9),
    ("Figure 10 — data I/O price (ImageNet vs CIFAR-10)", fig10),
    ("Figure 11 — number of trials", fig11),
    ("Figure 12 — instance initialisation latency and deadline", fig12),
]

NOTES = """\
All numbers are **simulated mean costs** of the cheapest plan each policy finds
(`rubberband.plan.whatif`): *static* is the paper's fixed-cluster baseline, *optimal* the
elastic planner; `static/optimal` is how many times cheaper elastic is. Plans within one sweep
share common random numbers (seed {seed}, {samples} Monte-Carlo samples). The model profiles
in `profiles/` are approximations shaped after the paper, not measurements, so compare trends,
not absolute dollars, with the paper's plots.

Set-ups (as in the paper's §6.1; p3.8xlarge at $12.24/h, per-instance billing rounded up to
1 s with a 60 s minimum unless a figure sweeps billing):

- **Fig. 9** `experiments/resnet50_sha64.yaml` — SHA(64, 4, 508, 2), ResNet-50 batch 512,
  instance init latency 0, 20-minute deadline. The iteration latency at one GPU is
  N(4 s, σ) with σ swept 1..10 s; at g GPUs its std is σ × mean(g) / 4 s, so every GPU count
  keeps the one-GPU coefficient of variation. (The `straggler_std` what-if axis instead sets
  the same std at every GPU count — at 16 GPUs a 0.5 s mean with a 10 s std is mostly clipped
  at zero, which is not a straggler model.)
- **Fig. 10** the same job; each instance launch downloads the dataset (150 GB ImageNet or
  0.15 GB CIFAR-10) at the swept price per GB.
- **Fig. 11** SHA(k, 4, 508, 2) for k = 16..512, 20-minute deadline, both billing models.
- **Fig. 12** `experiments/resnet50_sha512.yaml` — SHA(512, 4, 4096, 2), ResNet-50 batch
  2048 (12 s per iteration on one GPU), init latency 1, 10 or 100 s, deadline 90..160 min.
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=100, help="Monte-Carlo samples per plan (default 100)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    sections, total = [], time.perf_counter()
    for title, fn in FIGURES:
        with Timer(title) as t:
            png, table = fn(args.samples, args.seed)
        sections.append(f"## {title}\n\n![{title}]({png})\n\n{table}\n\n(computed in {t.seconds:.1f} s)\n")
    elapsed = time.perf_counter() - total
    readme = (
        "# The paper's simulated figures, regenerated\n\n"
        f"Regenerate with (from the repository root, about {elapsed:.0f} s on a 2-core machine):\n\n"
        f"```\n{COMMAND}" + (f" --samples {args.samples}" if args.samples != 100 else "")
        + (f" --seed {args.seed}" if args.seed else "") + "\n```\n\n"
        + NOTES.format(seed=args.seed, samples=args.samples) + "\n" + "\n".join(sections)
    )
    (OUT / "README.md").write_text(readme)
    print(f"wrote {OUT.relative_to(ROOT)}/ (4 PNGs + README.md) in {elapsed:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
