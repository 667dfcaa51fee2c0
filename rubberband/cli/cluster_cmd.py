"""`rubberband down` and `rubberband status`: what rubberband left running, and stopping it."""

from __future__ import annotations

import argparse

from rubberband.cli.common import command, emit
from rubberband.errors import ProviderError, SpecError
from rubberband.render import render


def _down_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--provider", default="local", help="local (default) or aws")
    p.add_argument("--run-id", help="only this run (default: every run rubberband started)")
    _aws_where_args(p)


def _aws_where_args(p: argparse.ArgumentParser) -> None:
    """Where `down` and `status` look for instances, besides the regions runs recorded."""
    p.add_argument("--region", action="append", default=[], help="aws: also look in this region (repeatable)")
    p.add_argument("--cluster", action="append", default=[], metavar="CLUSTER_YAML",
                   help="aws: also look in this cluster YAML's region (repeatable)")


def _aws_instance_lines(instances: list[dict]) -> list[str]:
    rows = [[i["instance_id"], i["region"], i["instance_type"], i["market"], i["state"], i["run_id"] or "-",
             _hms(i["uptime_s"]), f"${i['price_usd_per_hour']:.4f}/h",
             f"${i['cost_usd']:.4f}" if i["cost_usd"] is not None else "?"] for i in instances]
    return render(["instance", "region", "type", "market", "state", "run", "up", "price", "cost so far"], rows).splitlines()


def _hms(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def down_cmd(args: argparse.Namespace) -> int:
    if args.provider not in ("local", "aws"):
        raise SpecError(f"--provider: unknown provider {args.provider!r}; choose local or aws")
    if args.provider == "local":
        from rubberband.providers.local import down_all

        stopped = down_all("local", args.run_id)
        text = "\n".join(f"stopped local cluster {s['run_id']} ({s['processes']} processes)" for s in stopped) or "nothing to stop"
        emit(args, {"provider": args.provider, "stopped": stopped}, text)
        return 0
    from rubberband.providers import aws_cluster

    out = _aws_call(lambda: aws_cluster.down(args.region, args.run_id, args.cluster))
    lines = [f"stopped the head of aws run {h['run_id']} ({h['processes']} processes)" for h in out["heads"]]
    if out["terminated"]:
        lines.append(f"terminated {len(out['terminated'])} instance(s) in {', '.join(out['regions'])}:")
        lines += _aws_instance_lines(out["terminated"])
        lines.append(f"spend stopped: ${out['stopped_usd_per_hour']:.4f}/h (these instances had cost ${out['spent_usd']:.4f})")
    else:
        lines.append(f"no running rubberband instances in {', '.join(out['regions'])}")
    emit(args, {"provider": "aws", **out}, "\n".join(lines))
    return 0


def _aws_call(fn):
    """Run an EC2 query; turn a missing credential or an AWS error into one line."""
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        raise SpecError("--provider aws: boto3 is not installed; pip install 'rubberband[aws]'") from None
    from rubberband.providers.aws import safe_error

    try:
        return fn()
    except (BotoCoreError, ClientError) as exc:
        raise ProviderError(f"aws: {safe_error(exc)}") from None


down_cmd.arguments = _down_args  # type: ignore[attr-defined]
command("down", "stop every cluster and instance rubberband started")(down_cmd)


def _status_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--provider", default="all", help="local, aws or all (default)")
    p.add_argument("--run-id", help="only this run")
    _aws_where_args(p)


def status_cmd(args: argparse.Namespace) -> int:
    if args.provider not in ("local", "aws", "all"):
        raise SpecError(f"--provider: unknown provider {args.provider!r}; choose local, aws or all")
    out: dict = {}
    lines = []
    if args.provider in ("local", "all"):
        from rubberband.providers.local import LocalCluster

        clusters = [{"run_id": c.run_id, "provider": c.provider, "processes": len(c.processes()), "run_dir": str(c.run_dir)}
                    for c in LocalCluster.known() if args.run_id is None or c.run_id == args.run_id]
        out["clusters"] = clusters
        lines += [f"cluster head of {c['provider']} run {c['run_id']}: {c['processes']} processes ({c['run_dir']})"
                  for c in clusters] or ["no rubberband cluster heads on this machine"]
    if args.provider in ("aws", "all"):
        from rubberband.providers import aws_cluster

        regions = aws_cluster.known_regions(args.region + [aws_cluster._region_of(p) for p in args.cluster])
        if not regions and args.provider == "all":
            lines.append("aws: no region known (pass --region or --cluster, or set AWS_DEFAULT_REGION)")
        else:
            try:
                aws = _aws_call(lambda: aws_cluster.status(args.region, args.run_id, args.cluster))
            except ProviderError as exc:
                if args.provider == "aws":
                    raise
                # `status` with no provider named still shows the local side.
                lines.append(str(exc))
                emit(args, {**out, "aws_error": str(exc)}, "\n".join(lines))
                return 0
            out["aws"] = aws
            if aws["instances"]:
                lines += _aws_instance_lines(aws["instances"])
                lines.append(f"{len(aws['instances'])} instance(s) running: ${aws['usd_per_hour']:.4f}/h, "
                             f"${aws['spent_usd']:.4f} so far")
            else:
                lines.append(f"no running rubberband instances in {', '.join(aws['regions'])}")
    emit(args, out, "\n".join(lines))
    return 0


status_cmd.arguments = _status_args  # type: ignore[attr-defined]
command("status", "list running rubberband clusters and instances, with their cost so far")(status_cmd)
