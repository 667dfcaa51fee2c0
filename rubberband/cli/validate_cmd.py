"""`rubberband validate`: check an experiment file and print the resolved job.

Beyond what loading checks (which `plan` and `simulate` share), validate also reads the
`cluster:` YAML and imports the `trainer:`, so a job fails here rather than after it has
started paying for instances.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rubberband.cli.common import command, emit, experiment_arg, print_warnings, resolve_args
from rubberband.config import Experiment
from rubberband.errors import SpecError
from rubberband.profiles.cloud import Market
from rubberband.profiles.model import ModelProfile
from rubberband.render import render
from rubberband.spec.experiment import Surrogate
from rubberband.units import format_duration, format_usd


def stage_rows(exp: Experiment) -> list[list[object]]:
    """One row per stage; "iters so far" counts a trial's iterations, so it restarts with each
    HyperBand bracket (whose trials are new) and with a surrogate job's target stage (trained
    from scratch at full width, DESIGN §4.6)."""
    rows: list[list[object]] = []
    done = 0
    for i, stage in enumerate(exp.spec.stages):
        done = stage.iters if i in exp.spec.bracket_starts or stage.target else done + stage.iters
        rows.append([f"{i} target" if stage.target else i, stage.num_trials, stage.iters, done])
    return rows


def check_cluster(exp: Experiment, cluster: str) -> None:
    """Read ``cluster`` (the experiment's ``cluster:``) as the Ray cluster YAML ``run --provider aws``
    will launch from.

    Raises:
        SpecError: ``cluster: <the file's error>``, when no instance type the job may run on loads.
    """
    # Reads YAML only: a provider's SDK is imported by its cloud calls, which validate never makes.
    from rubberband.providers.base import load_cluster_yaml

    types = exp.catalog.instance_types if exp.auto_instance_type else [exp.instance_type]
    errors = []
    for name in types:   # `auto` may plan any type of the catalog: one the cluster launches is enough
        try:
            load_cluster_yaml(cluster, name)
            return
        except SpecError as exc:
            errors.append(exc)
    raise SpecError(f"cluster: {errors[0]}")


def check_trainer(exp: Experiment) -> object:
    """Import and build ``trainer:`` as each worker will (a function trainable: check its
    signature, and warn when it never checkpoints).

    Returns the trainer as the workers build it. This imports the user's module, and with it
    whatever that imports (torch, often): fine for `validate`, which is asked to check
    everything; `plan` and `simulate` never do it.

    Raises:
        SpecError: ``trainer: ...`` when it cannot be imported, built, or is not a trainer.
    """
    from rubberband.executor.worker import load_trainer

    try:
        trainer = load_trainer(exp.trainer)
    except SpecError:
        raise
    except Exception as exc:   # the user's code: a syntax error, a failing import or constructor
        raise SpecError(f"trainer: cannot load {exp.trainer!r}: {type(exc).__name__}: {' '.join(str(exc).split())}") from None
    from rubberband import function_api

    if function_api.is_function_trainable(trainer):
        for warning in function_api.check_function(trainer, repr(exp.trainer)):
            print(f"warning: {warning}", file=sys.stderr)
        return trainer
    missing = [m for m in ("build_model", "build_optimizer", "build_data") if not callable(getattr(trainer, m, None))]
    if missing:
        raise SpecError(f"trainer: {exp.trainer!r} has no {', '.join(missing)}; subclass rubberband.Trainer")
    return trainer


def check_surrogate(exp: Experiment, sur: Surrogate, trainer: object | None) -> dict[str, Any]:
    """What ``surrogate:`` does to this job: the widths, and the hyperparameters that do not
    transfer to full width. With a ``trainer:`` its ``width_keys`` must each be a constant of
    the search space (the full width) divisible by the ratio, and none may be in ``transfer``.

    Raises:
        SpecError: ``surrogate: ...`` naming the width key or trainer that is wrong.
    """
    from rubberband import function_api

    keys: tuple[str, ...] = ()
    widths: dict[str, tuple[Any, Any]] = {}
    if trainer is not None:
        if function_api.is_function_trainable(trainer):
            raise SpecError(f"surrogate: {exp.trainer!r} is a function trainable; a surrogate needs a Trainer class "
                            "with width_keys whose build_model reads its width from the config")
        from rubberband.surrogate.trainer import width_config, width_keys

        keys = width_keys(trainer)
        for key in keys:
            if key in sur.transfer:
                raise SpecError(f"surrogate.transfer: {key} is a width key of the trainer; the surrogate divides it "
                                "by width_ratio, so it cannot transfer: remove it")
            domain = exp.search_space.get(key)
            if isinstance(domain, (list, dict)):
                raise SpecError(f"search_space.{key}: a width key of the trainer must be one value, the full width "
                                f"(e.g. {key}: 128); the surrogate is tuned at that width / {sur.width_ratio}")
        full = {k: exp.search_space.get(k) for k in keys if k in exp.search_space}
        narrow = width_config(trainer, full, sur.width_ratio)     # one-line error for a missing or odd width
        widths = {k: (full[k], narrow[k]) for k in keys}
    return {"width_ratio": sur.width_ratio, "transfer": list(sur.transfer), "width_keys": list(keys),
            "widths": {k: {"full": f, "surrogate": n} for k, (f, n) in widths.items()},
            "not_transferred": list(sur.not_transferred(exp.search_space, keys)), "doubtful": list(sur.doubtful())}


def spot_model(spot) -> str:
    """A spot market's preemption model in a few words."""
    notice = f", {spot.notice_s:g}s notice"
    if spot.trace is not None:
        # DESIGN §4.1: the whole zone goes at once, so a trace market ignores notice_s.
        return f"replayed availability trace of zone {spot.trace.zone} (the zone goes at once: no notice)"
    if spot.advisor is not None:
        return f"Spot Advisor {spot.advisor} ({spot.rate_per_hour:g} reclaims/instance-h){notice}"
    if spot.modelled:
        return f"{spot.rate_per_hour:g} reclaims/instance-h{notice}"
    return "none: spot instances are modelled as never reclaimed"


def validate(args: argparse.Namespace) -> int:
    req = resolve_args(args)
    exp = req.experiment
    print_warnings(req)
    if exp.cluster:
        check_cluster(exp, exp.cluster)
    trainer = check_trainer(exp) if exp.trainer else None
    surrogate = check_surrogate(exp, exp.surrogate, trainer) if exp.surrogate else None
    for name in surrogate["doubtful"] if surrogate else []:
        print(f"warning: surrogate.transfer: μP does not transfer {name} across width (weight decay, dropout); "
              "its surrogate-tuned value may not be the best at full width", file=sys.stderr)
    clouds = [req.cloud_for(t) for t in req.types]
    market = req.market if isinstance(req.market, str) else req.market.value
    on_spot = req.market != Market.ON_DEMAND
    zone = clouds[0].spot.trace.zone if on_spot and clouds[0].spot.trace is not None else None
    payload = {
        "name": exp.name,
        "stages": [{"num_trials": s.num_trials, "iters": s.iters} for s in exp.spec.stages],
        "bracket_starts": list(exp.spec.bracket_starts),
        "model_profile": {"name": exp.model.name, "gpu_counts": list(exp.model.gpu_counts)},
        "model_profiles": {gpu: {"name": m.name, "gpu_counts": list(m.gpu_counts)} for gpu, m in exp.models.items()},
        "cloud": [c.to_dict() for c in clouds],
        "instance_type": exp.instance_type,
        "market": market,
        "confidence": req.confidence,
        "spot_model": spot_model(clouds[0].spot) if on_spot else None,
        "zone": zone,
        "deadline_s": exp.deadline_s,
        "policy": exp.policy,
        "samples": req.samples,
        "seed": req.seed,
        "warnings": list(req.warnings),
        "trainer": exp.trainer,
        "search_space": exp.search_space,
        "search": exp.search,
        "metric": exp.metric,
        "mode": exp.mode,
        "surrogate": surrogate,
    }
    lines = [f"experiment {exp.name}: OK ({exp.spec.describe()})", ""]
    lines.append(render(["stage", "trials", "iters", "iters so far"], stage_rows(exp)))
    lines.append("")
    profiles: list[tuple[str | None, ModelProfile]] = [*exp.models.items()] if exp.models else [(None, exp.model)]
    for gpu, m in profiles:     # one line per GPU model's profile
        lines.append(f"model profile  {m.name}" + (f" for {gpu} types" if gpu else "")
                     + f" (GPUs per trial profiled: {', '.join(map(str, m.gpu_counts))})")
    for c in clouds:
        spot = f", spot {format_usd(c.spot_price_usd_per_hour)}/h" if c.spot_price_usd_per_hour is not None else ""
        lines.append(
            f"instance type  {c.instance_type} in {c.provider}/{c.region}: {c.gpus_per_instance}x {c.gpu_model or 'GPU'}, "
            f"{format_usd(c.price_usd_per_hour)}/h on-demand{spot}, billing {c.billing.model.value}"
        )
    lines.append(f"market         {market}" + (" (spot or on-demand per stage)" if market == "auto" else ""))
    if on_spot:
        lines.append(f"spot model     {spot_model(clouds[0].spot)}")
    if zone:
        lines.append(f"zone           {zone}")
    if exp.deadline_s:
        lines.append(f"deadline       {format_duration(exp.deadline_s)} ({exp.deadline_s:.0f}s)"
                     + (f", P(meet) >= {req.confidence:g}" if req.confidence else ""))
    elif req.confidence:
        lines.append(f"confidence     {req.confidence:g}")
    lines.append(f"policy         {exp.policy}")
    if exp.trainer:
        lines.append(f"trainer        {exp.trainer}  (metric {exp.metric}, mode {exp.mode})")
    if exp.search_space:
        lines.append(f"search space   {', '.join(exp.search_space)} (search {exp.search})")
        from rubberband.executor.search_space import width_note

        note = width_note(exp.search_space, getattr(trainer, "width_keys", None))
        if note:
            lines.append(f"note: {note}")
    if surrogate is not None:
        widths = ", ".join(f"{k} {w['full']} -> {w['surrogate']}" for k, w in surrogate["widths"].items())
        lines.append(f"surrogate      μP, width / {surrogate['width_ratio']}" + (f" ({widths})" if widths else "")
                     + f"; transfers {', '.join(surrogate['transfer']) or 'nothing'}")
        lines.append(f"               not transferred: {', '.join(surrogate['not_transferred']) or 'none'}")
    emit(args, payload, "\n".join(lines))
    return 0


validate.arguments = experiment_arg  # type: ignore[attr-defined]
command("validate", "check an experiment file and print the resolved job")(validate)
