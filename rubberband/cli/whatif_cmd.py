"""`rubberband whatif`: sweep the job's and the cloud's parameters and compare policies."""

from __future__ import annotations

import argparse

from rubberband.cli.common import command, emit, experiment_arg, floats, int_list
from rubberband.config import load_experiment
from rubberband.errors import SpecError
from rubberband.render import render
from rubberband.units import format_duration, format_usd, parse_duration


def _whatif_args(p: argparse.ArgumentParser) -> None:
    experiment_arg(p)
    p.add_argument("--deadline", help="deadline or sweep START:STOP:STEP, e.g. 90m:160m:10m")
    p.add_argument("--trials", help="numbers of trials to sweep, e.g. 32,64,128 (SHA experiments)")
    p.add_argument("--init-latency", help="instance initialisation latencies to sweep, e.g. 1s,10s,100s")
    p.add_argument("--billing", help="billing models to sweep: per_instance,per_function")
    p.add_argument("--data-price", help="data prices in USD/GB to sweep, e.g. 0,0.01,0.16")
    p.add_argument("--dataset-gb", help="dataset sizes in GB to sweep, e.g. 0.15,150")
    p.add_argument("--instance-type", help="instance types to sweep, e.g. p3.2xlarge,p3.8xlarge")
    p.add_argument("--straggler-std", help="std of seconds per iteration to sweep, e.g. 1,5,10")
    p.add_argument("--policies", help="policies to compare (default: all)")
    p.add_argument("--samples", type=int, help="Monte-Carlo samples (default: 200)")
    p.add_argument("--seed", type=int, help="random seed (default: the experiment's)")
    p.add_argument("--plot", metavar="PNG", help="plot cost per policy over the first swept axis")


def whatif_cmd(args: argparse.Namespace) -> int:
    from rubberband.plan import POLICIES, saving, whatif
    from rubberband.units import parse_range

    exp = load_experiment(args.experiment)
    vary: dict[str, list] = {}
    deadline = exp.deadline_s
    if args.deadline:
        values = parse_range(args.deadline, "--deadline")
        if len(values) == 1:
            deadline = values[0]
        else:
            vary["deadline_s"] = values
    if args.trials:
        vary["num_trials"] = int_list(args.trials, "--trials")
    if args.init_latency:
        vary["init_latency_s"] = [parse_duration(v, "--init-latency") if v.strip() not in ("0", "0s") else 0.0
                                  for v in args.init_latency.split(",")]
    if args.billing:
        vary["billing"] = [v.strip() for v in args.billing.split(",")]
        for v in vary["billing"]:
            if v not in ("per_instance", "per_function"):
                raise SpecError(f"--billing: unknown billing model {v!r}; choose per_instance or per_function")
    if args.data_price:
        vary["data_price_usd_per_gb"] = floats(args.data_price, "--data-price")
    if args.dataset_gb:
        vary["dataset_gb"] = floats(args.dataset_gb, "--dataset-gb")
    if args.instance_type:
        vary["instance_type"] = [v.strip() for v in args.instance_type.split(",")]
        for v in vary["instance_type"]:
            exp.cloud_for(v)
    if args.straggler_std:
        vary["straggler_std"] = floats(args.straggler_std, "--straggler-std")
    if not vary:
        raise SpecError("whatif: nothing to sweep; pass e.g. --deadline 90m:160m:10m or --init-latency 1s,10s,100s")
    if deadline is None:
        raise SpecError("deadline: the experiment has no `deadline:`; pass --deadline")
    policies = [p.strip() for p in args.policies.split(",")] if args.policies else list(POLICIES)
    base_type = exp.catalog.instance_types[0] if exp.auto_instance_type else exp.instance_type
    scenarios = whatif(exp.spec, exp.model, exp.cloud_for(base_type), deadline, vary, policies,
                       samples=args.samples or 200, seed=args.seed if args.seed is not None else exp.seed,
                       spec_for_trials=exp.spec_with_trials if exp.sha else None, cloud_for_type=exp.cloud_for)
    axes = list(vary)
    rows = []
    for sc in scenarios:
        cells = [_fmt_axis(a, sc.values[a]) for a in axes]
        cells += [format_usd(sc.costs[p]) if sc.costs[p] is not None else "infeasible" for p in policies]
        ratio = saving(sc) if "static" in policies and "optimal" in policies else None
        cells.append(f"{ratio:.2f}x" if ratio else "-")
        rows.append(cells)
    text = render(axes + [f"{p} cost" for p in policies] + ["static/optimal"], rows,
                  title=f"what if: {exp.name} (mean cost of the cheapest plan per policy, deadline {format_duration(deadline)} unless swept)")
    payload = {"experiment": exp.name, "axes": axes, "policies": policies, "scenarios": [s.to_dict() for s in scenarios]}
    if args.plot:
        plot_whatif(scenarios, axes[0], policies, args.plot, title=exp.name)
        text += f"\nwrote {args.plot}"
        payload["plot"] = args.plot
    emit(args, payload, text)
    return 0


def _fmt_axis(axis: str, value) -> str:
    if axis in ("deadline_s", "init_latency_s"):
        return format_duration(float(value))
    return str(value)


def plot_whatif(scenarios, axis: str, policies, path: str, title: str = "") -> None:
    """Cost per policy over one swept axis, as a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SpecError("--plot: needs matplotlib; install it with `pip install 'rubberband[plot]'`") from None
    xs = [s.values[axis] for s in scenarios]
    numeric = all(isinstance(x, (int, float)) for x in xs)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for p in policies:
        ys = [s.costs[p] if s.costs[p] is not None else float("nan") for s in scenarios]
        xv = [x / 60 if axis == "deadline_s" else x for x in xs] if numeric else list(range(len(xs)))
        ax.plot(xv, ys, marker="o", label=p)
    if not numeric:
        ax.set_xticks(range(len(xs)), [str(x) for x in xs])
    ax.set_xlabel("deadline (min)" if axis == "deadline_s" else axis)
    ax.set_ylabel("mean cost (USD)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


whatif_cmd.arguments = _whatif_args  # type: ignore[attr-defined]
command("whatif", "sweep deadline, trials, latency, billing, data price or instance type and compare policies")(whatif_cmd)
