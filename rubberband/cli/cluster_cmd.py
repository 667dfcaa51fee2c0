"""`rubberband down` and `rubberband status`: what rubberband left running, and stopping it."""

from __future__ import annotations

import argparse

from rubberband.cli.common import command, emit
from rubberband.errors import ProviderError, SpecError
from rubberband.providers import base as providers
from rubberband.render import render


def _down_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--provider", default=providers.DEFAULT, help=f"{' or '.join(providers.names())} (default {providers.DEFAULT})")
    p.add_argument("--run-id", help="only this run (default: every run rubberband started)")
    _aws_where_args(p)


def _aws_where_args(p: argparse.ArgumentParser) -> None:
    """Where `down` and `status` look for instances, besides the regions runs recorded."""
    p.add_argument("--region", action="append", default=[], help="aws: also look in this region (repeatable)")
    p.add_argument("--cluster", action="append", default=[], metavar="CLUSTER_YAML",
                   help="aws: also look in this cluster YAML's region (repeatable)")


def _instance_lines(instances: list[dict]) -> list[str]:
    rows = [[i["instance_id"], i["region"], i["instance_type"], i["market"], i["state"], i["run_id"] or "-",
             _hms(i["uptime_s"]), f"${i['price_usd_per_hour']:.4f}/h",
             f"${i['cost_usd']:.4f}" if i["cost_usd"] is not None else "?"] for i in instances]
    return render(["instance", "region", "type", "market", "state", "run", "up", "price", "cost so far"], rows).splitlines()


def _hms(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def down_cmd(args: argparse.Namespace) -> int:
    provider = providers.get(args.provider, "--provider")
    out = provider.down(args.run_id, args.region, args.cluster)
    lines = [f"stopped {provider.name} cluster {h['run_id']} ({h['processes']} processes)" for h in out["heads"]]
    if "terminated" in out:       # a cloud: its instances
        if out["terminated"]:
            lines.append(f"terminated {len(out['terminated'])} instance(s) in {', '.join(out['regions'])}:")
            lines += _instance_lines(out["terminated"])
            lines.append(f"spend stopped: ${out['stopped_usd_per_hour']:.4f}/h "
                         f"(these instances had cost ${out['spent_usd']:.4f})")
        else:
            lines.append(f"no running rubberband instances in {', '.join(out['regions'])}")
    emit(args, {"provider": provider.name, **out}, "\n".join(lines) or "nothing to stop")
    return 0


down_cmd.arguments = _down_args  # type: ignore[attr-defined]
command("down", "stop every cluster and instance rubberband started")(down_cmd)


def _status_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--provider", default="all", help=f"{', '.join(providers.names())} or all (default)")
    p.add_argument("--run-id", help="only this run")
    _aws_where_args(p)


def status_cmd(args: argparse.Namespace) -> int:
    names = providers.names() if args.provider == "all" else (providers.get(args.provider, "--provider").name,)
    out: dict = {}
    lines = []
    for name in names:
        provider = providers.get(name)
        try:
            found = provider.status(args.run_id, args.region, args.cluster)
        except (SpecError, ProviderError) as exc:
            if args.provider != "all":
                raise
            # `status` with no provider named still shows the others.
            out[name] = {"error": str(exc)}
            lines.append(f"{name}: {exc}")
            continue
        out[name] = found
        lines += [f"cluster head of {name} run {h['run_id']}: {h['processes']} processes ({h['run_dir']})"
                  for h in found["heads"]] or [f"no {name} cluster heads on this machine"]
        if "instances" in found:      # a cloud: its instances
            if found["instances"]:
                lines += _instance_lines(found["instances"])
                lines.append(f"{len(found['instances'])} instance(s) running: ${found['usd_per_hour']:.4f}/h, "
                             f"${found['spent_usd']:.4f} so far")
            else:
                lines.append(f"no running rubberband instances in {', '.join(found['regions'])}")
    emit(args, out, "\n".join(lines))
    return 0


status_cmd.arguments = _status_args  # type: ignore[attr-defined]
command("status", "list running rubberband clusters and instances, with their cost so far")(status_cmd)
