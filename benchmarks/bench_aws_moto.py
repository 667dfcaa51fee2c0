"""The aws provider's timings against a moto EC2 server on this machine.

Runs a 2-trial stage on two spot g5.xlarge instances (each mirrored by a local Ray node),
reclaims one instance straight on moto while its trial trains, and prints, from the
provider's event log and EC2's own times: request -> EC2 running -> Ray node ready per
instance, reclaim -> detected -> replacement running -> ready, the run's JCT and cost, how
long after the job the last instance was terminated, and the instances moto still runs (0).

    .venv/bin/python benchmarks/bench_aws_moto.py
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    tmp = Path(tempfile.mkdtemp(prefix="rb-bench-aws-"))
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                      AWS_DEFAULT_REGION="us-east-1", RUBBERBAND_STATE_DIR=str(tmp / "state"),
                      RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    import rubberband as rb
    from rubberband.executor.run import execute
    from rubberband.plan import plan_allocation

    ec2 = boto3.client("ec2", region_name="us-east-1")
    cluster = tmp / "cluster.yaml"
    cluster.write_text(
        "cluster_name: bench\nmax_workers: 4\nprovider: {type: aws, region: us-east-1}\nhead_node_type: head\n"
        "available_node_types:\n  head: {node_config: {InstanceType: m5.large, ImageId: ami-12345678}}\n"
        "  gpu: {node_config: {InstanceType: g5.xlarge, ImageId: ami-12345678, InstanceMarketOptions: {MarketType: spot}}}\n")
    model = rb.ModelProfile.load(ROOT / "profiles" / "demo_digits_local.yaml")
    model = model.replace(iter_latency_s={1: model.iter_latency_s[1]})
    cloud = rb.CloudProfile.load(ROOT / "cloud_profiles" / "aws" / "us-east-1.yaml", "g5.xlarge", market="spot")
    plan = plan_allocation(rb.ExperimentSpec.from_stages([(2, 30)]), (2,), model, cloud, deadline_s=3600, samples=20)
    run_id = "bench-aws"
    run_dir = tmp / "runs" / run_id
    reclaim = {}

    def on_event(kind, data):
        if kind == "gang" and data["trial"] == "t000" and not reclaim:
            reclaim["instance"] = data["instances"][0]

            def later():
                ckpt = run_dir / "checkpoints" / "t000.pt"
                while not ckpt.exists():
                    time.sleep(0.05)
                found = ec2.describe_instances(Filters=[
                    {"Name": "tag:rubberband:instance", "Values": [reclaim["instance"]]},
                    {"Name": "tag:rubberband:run-id", "Values": [run_id]}])
                iid = found["Reservations"][0]["Instances"][0]["InstanceId"]
                reclaim["t"] = time.time()
                ec2.terminate_instances(InstanceIds=[iid])

            threading.Thread(target=later, daemon=True).start()

    t0 = time.time()
    result = execute(plan, "rubberband.examples.digits:DigitsMLP", {"lr": [0.05, 0.1]}, provider="aws",
                     runs_dir=tmp / "runs", latency_scale=0.05, on_event=on_event, run_id=run_id,
                     cluster_config=str(cluster))
    wall = time.time() - t0
    import json

    events = [json.loads(line) for line in (run_dir / "provider" / "events.jsonl").read_text().splitlines()]
    first = events[0]["t"]
    print(f"aws provider against moto ({endpoint}), 2 x g5.xlarge spot, latency_scale 0.05")
    print("instance        request  EC2 running  Ray ready  terminated  reason")
    by: dict[str, dict] = {}
    for e in events:
        if e["event"] in ("request", "running", "ready", "terminated"):
            t = e.get("t_ec2") if e.get("t_ec2") is not None else e["t"]
            by.setdefault(e["instance"], {})[e["event"]] = t - first
            if e["event"] == "terminated":
                by[e["instance"]]["reason"] = e.get("reason")
    for inst, t in by.items():
        cells = [f"{t[k]:9.2f}s" if k in t else "        -" for k in ("request", "running", "ready", "terminated")]
        print(f"{inst:14s} {'  '.join(cells)}  {t.get('reason', '-')}")
    detected = next(e["t"] for e in events if e.get("reason") == "interrupted")
    replacement = [e for e in events if e["event"] == "request" and e["t"] > detected][0]["instance"]
    ready = next(e["t"] for e in events if e["event"] == "ready" and e["instance"] == replacement)
    print(f"reclaim -> detected by the provider: {detected - reclaim['t']:.2f}s (EC2 times are whole seconds)")
    print(f"detected -> replacement ready: {ready - detected:.2f}s")
    print(f"trial t000 restarts: {result.trials['t000']['restarts']}, finished at step {result.trials['t000']['step']}")
    print(f"JCT {result.actual['jct_s']:.1f}s (wall {wall:.1f}s incl. head start/stop), cost ${result.actual['cost_usd']:.4f} "
          f"for {len(result.ledger['instances'])} instances")
    live = ec2.describe_instances(Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}])
    print(f"instances moto still runs: {sum(len(r['Instances']) for r in live['Reservations'])}")
    server.stop()


if __name__ == "__main__":
    main()
