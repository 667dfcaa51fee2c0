"""`rubberband whatif`: sweep the job's and the cloud's parameters and compare policies."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from rubberband.cli.common import (
    IMAGE_TYPES,
    command,
    emit,
    experiment_arg,
    floats,
    int_list,
    output_path,
    print_warnings,
    whole,
)
from rubberband.cli.plan_cmd import ProgressLine
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
    p.add_argument("--market", help="markets to sweep: on-demand,spot,auto (auto: spot or on-demand per stage)")
    p.add_argument("--preemption-rate", help="spot reclaims per instance-hour to sweep, e.g. 0,0.2,1")
    p.add_argument("--zone", help="spot availability trace zones to replay, e.g. us-east-1a,us-west-2b "
                                  "(from the experiment's trace file, else the shipped AWS V100 traces)")
    p.add_argument("--notice", help="spot interruption notices to sweep, e.g. 0,120 (seconds)")
    p.add_argument("--budget", help="budgets in USD to sweep, e.g. 20,50,100: the shortest mean JCT within each "
                                    "(no deadline; --plot draws JCT over budget)")
    p.add_argument("--packing", help="the most trials per GPU the optimal plan may pack, e.g. 1,2,4 (1: none; "
                                     "counts the model profile has packed latencies for)")
    p.add_argument("--surrogate-ratio", help="width ratios S to weigh, e.g. 1,4,8,16: tuning on a μP copy S times "
                                             "narrower plus one full-width training of the winner (1: tuning at "
                                             "full width), each planned whole (DESIGN §4.6)")
    p.add_argument("--surrogate-profiles", metavar="S=YAML,...",
                   help="measured surrogate profiles by ratio, e.g. 8=profiles/w8.yaml (default: the experiment's "
                        "surrogate.model_profile at its width_ratio; any other ratio is scaled from the full-width "
                        "profile, an approximation)")
    p.add_argument("--compute-fraction", type=float, default=None,
                   help="the part of a full-width iteration that shrinks 1/S² on a surrogate, for ratios with no "
                        "measured profile (default 0.9)")
    p.add_argument("--eager-transfer", metavar="F,...",
                   help="a surrogate job's target started early, after these fractions of the surrogate trials are "
                        "done, e.g. off,0.5,0.75 (off: after the tuning), each planned (DESIGN §4.6)")
    p.add_argument("--restart-probability", type=float, default=None,
                   help="with --eager-transfer: the chance the early target restarts with another winner "
                        "(default per fraction: 1 - 1/n, n the trials promoted at the hand-over; 0 where n is 1)")
    p.add_argument("--policies", help="policies to compare (default: all)")
    p.add_argument("--samples", type=whole, help="Monte-Carlo samples (default: 200)")
    p.add_argument("--seed", type=whole, help="random seed (default: the experiment's)")
    p.add_argument("--plot", metavar="PNG",
                   help="plot cost per policy over the first swept axis, one line per value of the others")


def _g(value) -> str:
    return f"{value:g}"


def _or(value: float | None, fmt: Callable[[float], str], none: str) -> str:
    """``value`` formatted, or ``none`` where there is none (infeasible, over budget)."""
    return none if value is None else fmt(value)


# Per swept axis: the column header (with its unit) and how a value is written in it.
AXIS_COLUMNS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "deadline_s": ("deadline", format_duration),
    "num_trials": ("trials", str),
    "init_latency_s": ("init latency", lambda v: f"{v:g}s"),
    "billing": ("billing", str),
    "data_price_usd_per_gb": ("data price (USD/GB)", _g),
    "dataset_gb": ("dataset (GB)", _g),
    "instance_type": ("instance type", str),
    "straggler_std": ("straggler std (s/iter)", _g),
    "market": ("market", str),
    "preemption_rate": ("reclaims/instance-h", _g),
    "zone": ("zone", str),
    "notice_s": ("notice", lambda v: f"{v:g}s"),
    "budget_usd": ("budget (USD)", _g),
    "packing": ("packing (trials/GPU)", str),
}


def whatif_cmd(args: argparse.Namespace) -> int:
    from rubberband.limits import check_sweep
    from rubberband.plan import POLICIES, saving, whatif
    from rubberband.request import Overrides, resolve
    from rubberband.units import parse_range

    output_path(args.plot, "--plot", "cost.png", IMAGE_TYPES)
    # The swept flags (--deadline, --market, --instance-type, --budget) are axes, not overrides.
    req = resolve(args.experiment, Overrides(seed=args.seed))
    print_warnings(req)
    exp = req.experiment
    if args.surrogate_ratio is not None:
        return surrogate_whatif(args, req)
    if args.eager_transfer is not None:
        return eager_whatif(args, req)
    if args.restart_probability is not None:
        raise SpecError("--restart-probability: it goes with --eager-transfer; add --eager-transfer off,0.5")
    vary: dict[str, list] = {}
    deadline = exp.deadline_s
    policies = [p.strip() for p in args.policies.split(",")] if args.policies else list(POLICIES)
    samples = args.samples if args.samples is not None else 200
    if args.deadline is not None:
        # A range of millions of deadlines is refused before it is listed (the list alone took 354 MB).
        check_sweep(range_count(args.deadline, "--deadline"), len(policies), req.spec.trials, samples)
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
            req.cloud_for(v)
    if args.straggler_std:
        vary["straggler_std"] = floats(args.straggler_std, "--straggler-std")
    if args.market:
        vary["market"] = [v.strip() for v in args.market.split(",") if v.strip()]
    if args.preemption_rate:
        vary["preemption_rate"] = floats(args.preemption_rate, "--preemption-rate")
        if min(vary["preemption_rate"]) < 0:
            raise SpecError("--preemption-rate: reclaims per instance-hour cannot be negative; e.g. 0,0.2,1")
    if args.zone:
        vary["zone"] = [v.strip() for v in args.zone.split(",") if v.strip()]
    if args.notice:
        vary["notice_s"] = [parse_duration(v, "--notice") if v.strip() not in ("0", "0s") else 0.0
                            for v in args.notice.split(",")]
    if args.packing:
        vary["packing"] = int_list(args.packing, "--packing", "whole numbers of trials per GPU such as 1,2,4")
    if args.budget:
        vary["budget_usd"] = floats(args.budget, "--budget")
        if not min(vary["budget_usd"]) > 0:
            raise SpecError("--budget: expected positive amounts of dollars, e.g. 20,50,100")
        if args.deadline is not None:
            raise SpecError("--budget: a budget sweep plans the shortest JCT per budget, with no deadline; drop --deadline")
        deadline = math.inf     # no constraint: each budget's plan is the fastest within it
    if not vary:
        raise SpecError("whatif: nothing to sweep; pass e.g. --deadline 90m:160m:10m or --init-latency 1s,10s,100s")
    if deadline is None:
        raise SpecError("deadline: the experiment has no `deadline:`; pass --deadline")
    cloud = req.cloud
    with ProgressLine(args) as progress:
        scenarios = whatif(req.spec, req.models, cloud, deadline, vary, policies, samples=samples, seed=req.seed,
                           spec_for_trials=exp.spec_with_trials if exp.sha else None, cloud_for_type=req.cloud_for,
                           trace_file=cloud.spot.trace_file or _shipped_traces(exp), progress=progress,
                           market=req.market, confidence=req.confidence)
    axes = list(vary)
    budgets = "budget_usd" in vary       # then each policy's column is its JCT, not its cost
    rows = []
    for sc in scenarios:
        cells = [AXIS_COLUMNS[a][1](sc.values[a]) for a in axes]
        if budgets:
            cells += [_or(sc.jcts[p], format_duration, "over budget") for p in policies]
            ratio = jct_ratio(sc) if "static" in policies and "optimal" in policies else None
        else:
            cells += [_or(sc.costs[p], format_usd, "infeasible") for p in policies]
            ratio = saving(sc) if "static" in policies and "optimal" in policies else None
        cells.append(f"{ratio:.2f}x" if ratio else "-")
        if "packing" in vary and "optimal" in policies:     # what the optimal plan packed, per stage
            cells.append(",".join(map(str, sc.trials_per_gpu.get("optimal") or ())) or "-")
        rows.append(cells)
    measure = "JCT" if budgets else "cost (USD)"
    headers = [AXIS_COLUMNS[a][0] for a in axes] + [f"{p} {measure}" for p in policies] + [f"static/optimal {measure.split()[0]}"]
    headers += ["optimal trials/GPU"] if "packing" in vary and "optimal" in policies else []
    title = (f"what if: {exp.name} (shortest mean JCT within each budget per policy)" if budgets else
             f"what if: {exp.name} (mean cost of the cheapest plan per policy, deadline {format_duration(deadline)} unless swept)")
    text = render(headers, rows, title=title)
    payload = {"experiment": exp.name, "axes": axes, "policies": policies, "scenarios": [s.to_dict() for s in scenarios]}
    if args.plot:
        plot_whatif(scenarios, axes, policies, args.plot, title=exp.name)
        text += f"\nwrote {args.plot}"
        payload["plot"] = args.plot
    emit(args, payload, text)
    return 0


SWEEP_FLAGS = ("trials", "init_latency", "billing", "data_price", "dataset_gb", "instance_type", "straggler_std",
               "market", "preemption_rate", "zone", "notice", "budget", "packing", "policies", "plot")


def surrogate_whatif(args: argparse.Namespace, req) -> int:
    """``--surrogate-ratio``: the whole job's cheapest plan per width ratio (``surrogate_sweep``)."""
    from rubberband.plan.whatif import SURROGATE_COMPUTE_FRACTION, surrogate_sweep
    from rubberband.profiles.model import ModelProfile
    from rubberband.schema import load_yaml

    other = [f"--{f.replace('_', '-')}" for f in SWEEP_FLAGS if getattr(args, f, None)]
    if other:
        raise SpecError(f"--surrogate-ratio: weighs width ratios alone; drop {', '.join(other)}")
    if args.surrogate_profiles is not None and args.surrogate_ratio is None:
        raise SpecError("--surrogate-profiles: it gives --surrogate-ratio's measured profiles; add --surrogate-ratio")
    exp = req.experiment
    ratios = int_list(args.surrogate_ratio, "--surrogate-ratio", "whole width ratios such as 1,4,8,16")
    measured: dict[int, ModelProfile] = {}
    if exp.surrogate is not None and exp.surrogate_model is not None:
        measured[exp.surrogate.width_ratio] = exp.surrogate_model
    for item in (args.surrogate_profiles or "").split(","):
        if not item.strip():
            continue
        ratio, sep, path = item.partition("=")
        if not sep or not ratio.strip().isdigit():
            raise SpecError(f"--surrogate-profiles: expected S=YAML such as 8=profiles/w8.yaml, got {item!r}")
        measured[int(ratio)] = ModelProfile.from_dict(load_yaml(path.strip(), "--surrogate-profiles"),
                                                      where=f"--surrogate-profiles {path.strip()}")
    f = args.compute_fraction if args.compute_fraction is not None else SURROGATE_COMPUTE_FRACTION
    deadline = _one_type_deadline(args, req, "--surrogate-ratio")
    tuning = req.spec.tuning
    target_iters = exp.spec.stages[-1].iters if exp.spec.target_stage is not None else \
        max(sum(b.iters) for b in tuning.brackets())
    samples = args.samples if args.samples is not None else 200
    with ProgressLine(args) as progress:
        rows = surrogate_sweep(tuning, exp.model, req.catalog, deadline, ratios, target_iters, measured,
                               compute_fraction=f, samples=samples, seed=req.seed, instance_type=req.instance_type,
                               market=req.market, confidence=req.confidence, progress=progress)
    base = next((r for r in rows if r.ratio == 1 and r.cost_usd is not None), None)
    table = []
    for r in rows:
        if r.cost_usd is None:
            table.append([r.ratio, r.profile, "infeasible", "-", "-", "-", "-", "-"])
            continue
        def part(s: float | None, usd: float | None) -> str:
            return "-" if s is None or usd is None else f"{format_duration(s)} {format_usd(usd)}"

        table.append([r.ratio, r.profile, _or(r.jct_s, format_duration, "-"), format_usd(r.cost_usd),
                      part(r.tuning_s, r.tuning_usd), part(r.target_s, r.target_usd),
                      _or(r.p_meet, lambda p: f"{p:.0%}", "-"),
                      f"{base.cost_usd / r.cost_usd:.2f}x" if base is not None and base.cost_usd else "-"])
    text = render(["S", "surrogate profile", "JCT mean", "cost mean", "tuning", "target training", "P(meet)",
                   "saving vs S=1"], table,
                  title=f"what if: {exp.name} tuned on μP surrogates S times narrower, then the winner trained at "
                        f"full width for {target_iters} iterations (deadline {format_duration(deadline)})")
    if any(r.profile == "approximation" for r in rows):
        text += (f"\napproximation: a surrogate profile scaled from the full-width one: iteration latency "
                 f"x (f/S² + 1 - f), f = {f:g} (Hydro's FLOP ratio on the compute part), start-up and SYNC kept; "
                 "measure it (`rubberband profile` at width / S) for a real figure")
    emit(args, {"experiment": exp.name, "target_iters": target_iters, "compute_fraction": f,
                "ratios": [r.to_dict() for r in rows]}, text)
    return 0


def _one_type_deadline(args: argparse.Namespace, req, flag: str) -> float:
    """The deadline a surrogate job's what-if (``flag``) plans to, on the one instance type and
    full-width profile it weighs.

    Raises:
        SpecError: no deadline anywhere, or an ``auto`` type / profiles by GPU model.
    """
    exp = req.experiment
    deadline = parse_duration(args.deadline, "--deadline") if args.deadline is not None else exp.deadline_s
    if deadline is None:
        raise SpecError("deadline: the experiment has no `deadline:`; pass --deadline")
    if req.auto_instance_type or isinstance(exp.model_for_planning, dict):
        raise SpecError(f"{flag}: weighs one instance type and one full-width profile; "
                        "pass --instance-type NAME (not auto)")
    return float(deadline)


def eager_whatif(args: argparse.Namespace, req) -> int:
    """``--eager-transfer``: a surrogate job's plan per hand-over fraction (``eager_sweep``)."""
    from rubberband.plan.whatif import eager_sweep

    other = [f"--{f.replace('_', '-')}" for f in (*SWEEP_FLAGS, "surrogate_profiles", "compute_fraction")
             if getattr(args, f, None) is not None and getattr(args, f, None) is not False]
    if other:
        raise SpecError(f"--eager-transfer: weighs when the target starts, alone; drop {', '.join(other)}")
    exp = req.experiment
    if exp.spec.target_stage is None:
        raise SpecError("--eager-transfer: weighs when a surrogate job's target starts; the experiment has no "
                        "`surrogate:`; add one (see experiments/demo_surrogate.yaml)")
    from rubberband.spec.experiment import eager_transfer

    p = args.restart_probability
    if p is not None and not 0.0 <= p <= 1.0:
        raise SpecError(f"--restart-probability: expected a probability from 0 to 1, got {p:g}")
    fractions: list[float | None] = []
    for item in args.eager_transfer.split(","):
        item = item.strip()
        if item == "off":
            fractions.append(None)
            continue
        try:
            after = float(item)
        except ValueError:
            raise SpecError(f"--eager-transfer: expected fractions of surrogate trials done, or off, such as "
                            f"off,0.5,0.75; got {item!r}") from None
        try:
            eager_transfer(exp.spec.tuning, after)
        except SpecError as err:        # said of the experiment file's field: say it of the flag
            raise SpecError(f"--eager-transfer {item}: {str(err).split(': ', 1)[-1]}") from None
        fractions.append(after)
    deadline = _one_type_deadline(args, req, "--eager-transfer")
    surrogate, target = exp.job_models()
    samples = args.samples if args.samples is not None else 200
    with ProgressLine(args) as progress:
        rows = eager_sweep(req.spec, surrogate, target, req.catalog, deadline, fractions, args.restart_probability,
                           samples=samples, seed=req.seed, instance_type=req.instance_type, market=req.market,
                           confidence=req.confidence, progress=progress)
    table = []
    for r in rows:
        start = "after tuning" if r.after is None else f"{r.after:g} (after stage {r.after_stage})"
        restart = "-" if r.restart_probability is None else f"{r.restart_probability:.2g}"
        if r.cost_usd is None or r.jct_s is None:
            table.append([start, restart, "infeasible", "-", "-", "-", "-", "-"])
            continue
        same = "-" if r.sequential_jct_s is None or r.sequential_cost_usd is None else \
            f"{format_duration(r.sequential_jct_s)} {format_usd(r.sequential_cost_usd)}"
        table.append([start, restart, ",".join(map(str, r.allocation or ())), format_duration(r.jct_s),
                      _or(r.jct_p90_s, format_duration, "-"), format_usd(r.cost_usd),
                      _or(r.p_meet, lambda p: f"{p:.0%}", "-"), same])
    text = render(["target starts", "restart prob.", "allocation", "JCT mean", "JCT p90", "cost mean", "P(meet)",
                   "same plan, target after tuning"], table,
                  title=f"what if: {exp.name}'s full-width target started early (eager transfer), deadline "
                        f"{format_duration(deadline)}")
    text += ("\neach row is the cheapest plan found that meets the deadline with the target started that way (DESIGN "
             "§4.6: within 8% of the cheapest, not exact); the last column runs that plan's allocation with the "
             "target after the tuning. A restart trains the winner from scratch when it is not the trial handed over")
    emit(args, {"experiment": exp.name, "fractions": [r.to_dict() for r in rows]}, text)
    return 0


def range_count(text: str, field: str) -> int:
    """How many values ``START:STOP:STEP`` (or a comma list) names, without listing them."""
    parts = str(text).split(":")
    if len(parts) != 3:
        return len([p for p in str(text).split(",") if p.strip()])
    start, stop, step = (parse_duration(p, field) for p in parts)
    return max(1, int(math.floor((stop - start) / step + 1e-9)) + 1)


def jct_ratio(scenario) -> float | None:
    """How many times longer the static plan runs than the optimal one within the same budget."""
    a, b = scenario.jcts.get("optimal"), scenario.jcts.get("static")
    return None if not a or b is None else b / a


def _shipped_traces(exp) -> str | None:
    """The AWS V100 traces shipped beside the experiment's region file, if there."""
    from pathlib import Path

    if not exp.catalog.path:
        return None
    path = Path(exp.catalog.path).parent / "spot_traces" / "p3.2xlarge.json"
    return str(path) if path.is_file() else None


def varying(scenarios, axes: list[str]) -> list[str]:
    """The axes that take more than one value in ``scenarios`` (a single value is no axis to plot)."""
    return [a for a in axes if len({repr(sc.values[a]) for sc in scenarios}) > 1]


def x_axis(scenarios, axes: list[str]) -> str:
    """The plot's x axis: the first axis swept over more than one value (else the first)."""
    return (varying(scenarios, axes) or axes)[0]


def plot_series(scenarios, axes: list[str], policies) -> list[tuple[str, list, list]]:
    """Lines to plot: cost (JCT when budgets are swept) over the first axis of several values
    (``x_axis``: `--market spot --preemption-rate 0,0.3,2` plots over the rates), one per policy
    and combination of the other axes of several values.

    Returns:
        ``(label, xs, costs)`` per line, ``xs`` in sweep order (``None`` cost: infeasible).
    """
    first, rest = x_axis(scenarios, axes), [a for a in varying(scenarios, axes) if a != x_axis(scenarios, axes)]
    groups: dict[tuple, list] = {}
    for sc in scenarios:
        groups.setdefault(tuple(sc.values[a] for a in rest), []).append(sc)
    lines = []
    for p in policies:
        for key, members in groups.items():
            label = ", ".join([p] + [f"{AXIS_COLUMNS[a][0]} {AXIS_COLUMNS[a][1](v)}" for a, v in zip(rest, key)])
            lines.append((label, [sc.values[first] for sc in members],
                          [(sc.jcts if "budget_usd" in axes else sc.costs)[p] for sc in members]))
    return lines


def whatif_figure(scenarios, axes: list[str], policies, title: str = ""):
    """A matplotlib figure of ``plot_series``: one colour per policy, one line style per value of the other axes."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SpecError("--plot: needs matplotlib; install it with `pip install 'rubberband[plot]'`") from None
    axis = x_axis(scenarios, axes)
    lines = plot_series(scenarios, axes, policies)
    per_y = 60 if "budget_usd" in axes else 1      # JCT in minutes
    xs = lines[0][1]
    numeric = all(isinstance(x, (int, float)) for x in xs)
    styles = ["-", "--", ":", "-."]
    per_policy = len(lines) // len(policies)
    outside = len(lines) > len(policies)          # many lines: keep the legend off the data
    fig, ax = plt.subplots(figsize=(9.5 if outside else 7, 4.2))
    for i, (label, x, ys) in enumerate(lines):
        xv = [v / 60 if axis == "deadline_s" else v for v in x] if numeric else list(range(len(x)))
        ax.plot(xv, [float("nan") if y is None else y / per_y for y in ys], marker="o", label=label,
                color=f"C{i // per_policy}", linestyle=styles[i % per_policy % len(styles)])
    if not numeric:
        ax.set_xticks(range(len(xs)), [str(x) for x in xs])
    elif axis == "packing":       # whole trials per GPU
        ax.set_xticks(xs)
    header = AXIS_COLUMNS[axis][0]
    ax.set_xlabel("deadline (min)" if axis == "deadline_s" else f"{header} (s)" if axis == "init_latency_s" else header)
    ax.set_ylabel("mean JCT (min)" if "budget_usd" in axes else "mean cost (USD)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if outside:
        ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))
    else:
        ax.legend()
    fig.tight_layout()
    return fig


def plot_whatif(scenarios, axes: list[str], policies, path: str, title: str = "") -> None:
    """Write ``whatif_figure`` as a PNG."""
    import matplotlib.pyplot as plt

    fig = whatif_figure(scenarios, axes, policies, title)
    fig.savefig(path, dpi=110)
    plt.close(fig)


whatif_cmd.arguments = _whatif_args  # type: ignore[attr-defined]
command("whatif", "sweep deadline, trials, latency, billing, data price or instance type and compare policies")(whatif_cmd)
