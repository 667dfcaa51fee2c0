#!/usr/bin/env python
"""Measure the demo job on this machine and write the profiles the planner uses for it.

Starts a local cluster of the demo experiment's instance type, and measures with the real
executor pieces (the local provider, Ray's autoscaler, warm DDP worker gangs):

* the provider's latencies: request -> running (emulated provisioning) and running -> ready
  with warm workers (real: raylet start plus worker warm-up), over two launches;
* per GPUs-per-trial count (1, 2, ... up to the instance's GPUs): trial start-up (a gang
  formed from warm workers, checkpoint restored) and seconds per iteration, with the instance
  full of such gangs as a stage would run them, warm-up iterations dropped.

Writes the model profile (``profiles/demo_digits_local.yaml``) and the measured
initialisation latency into ``cloud_profiles/local/local.yaml``. Until the profiler issue
lands this is how ``scripts/demo`` calibrates its prediction.

Usage: python scripts/measure_demo_profile.py [experiments/demo.yaml] [--iters 6] [--repeats 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import statistics
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _normal(samples: list[float]) -> dict:
    mean = statistics.fmean(samples)
    std = statistics.pstdev(samples) if len(samples) > 1 else 0.0
    return {"dist": "normal", "mean": round(mean, 4), "std": round(std, 4)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("experiment", nargs="?", default=str(ROOT / "experiments" / "demo.yaml"))
    parser.add_argument("--iters", type=int, default=6, help="iterations per measurement (first dropped)")
    parser.add_argument("--repeats", type=int, default=3, help="gang starts per GPU count")
    args = parser.parse_args(argv)
    if args.iters < 2:
        print("error: --iters must be at least 2 (the first iteration is dropped as warm-up)", file=sys.stderr)
        return 2
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")

    import ray

    import rubberband as rb
    from rubberband.execute.ray_runner import RayClusterPort, RayTrialRunner
    from rubberband.execute.search_space import sample_configs
    from rubberband.providers.local import LocalCluster

    exp = rb.load_experiment(args.experiment)
    cloud = exp.cloud
    G = cloud.gpus_per_instance
    config = sample_configs(exp.search_space, 1, seed=exp.seed)[0]
    run_id = "measure-" + time.strftime("%H%M%S")
    run_dir = ROOT / "runs" / run_id
    t_start = time.time()
    cluster = LocalCluster.start(run_id, run_dir, cloud, max_instances=2, seed=exp.seed)
    init, provision, startup, latency = [], [], {}, {}
    try:
        ray.init(address=cluster.address, logging_level=logging.ERROR, log_to_driver=False)
        port = RayClusterPort(G, events=cluster.read_events)
        runner = RayTrialRunner(exp.trainer, seed=exp.seed)
        for count in (1, 2):        # two launches: request -> running -> ready with warm workers
            port.scale_to(count, 0)
            nodes = port.wait_nodes(count, 300)
            runner.warm(nodes)
            warm_at = time.time()
            new = nodes[-1].name
            events = {e["event"]: e["t"] for e in cluster.read_events() if e["instance"] == new}
            provision.append(events["running"] - events["request"])
            init.append(warm_at - events["running"])
            print(f"instance {new}: provisioning {provision[-1]:.2f}s, initialisation {init[-1]:.2f}s", flush=True)
        inst = nodes[0].name
        m = 1
        while m <= min(G, exp.model.max_gpus):
            starts, iters = [], []
            for _ in range(args.repeats):
                t0 = time.time()
                gangs = [runner.start(f"m{m}-{k}", config, [inst] * m, None) for k in range(G // m)]
                starts.append((time.time() - t0) / len(gangs))
                futures = [runner.train(g, args.iters) for g in gangs]
                for f in futures:
                    iters.extend(runner.result(f).iter_times[1:])
                for g in gangs:
                    runner.stop(g)
            startup[m], latency[m] = starts, iters
            print(f"{m} GPU(s)/trial: start-up {statistics.fmean(starts):.3f}s, "
                  f"iteration {statistics.fmean(iters):.4f}s +- {statistics.pstdev(iters):.4f}", flush=True)
            m *= 2
        runner.shutdown()
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.stop()
    took = time.time() - t_start

    trainer_name = exp.trainer.split(":")[-1] if exp.trainer else "trainer"
    all_starts = [s for v in startup.values() for s in v]
    profile = {
        "name": Path(exp.model.name).name,
        "description": f"{trainer_name} on this machine's CPU, measured by scripts/measure_demo_profile.py",
        "measured_on": {"provider": "local", "instance_type": cloud.instance_type, "gpu_model": "logical",
                        "host": os.uname().nodename},
        "measured_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "rubberband_version": rb.__version__,
        "profiling": {"seconds": round(took, 1), "iters": args.iters, "repeats": args.repeats},
        "iter_latency_s": {m: _normal(v) for m, v in latency.items()},
        "trial_startup_s": _normal(all_starts),
        "sync_s": {"dist": "constant", "value": 0.05},
    }
    model_path = Path(args.experiment).resolve().parent / _model_path(args.experiment)
    model_path.write_text("# Measured on this machine by scripts/measure_demo_profile.py; rerun it to refresh.\n"
                          + yaml.safe_dump(profile, sort_keys=False))
    cloud_path = Path(args.experiment).resolve().parent / _cloud_path(args.experiment)
    text = cloud_path.read_text()
    data = yaml.safe_load(text)
    data["defaults"]["init_latency_s"] = _normal(init)
    header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    cloud_path.write_text(header + yaml.safe_dump(data, sort_keys=False))
    print(f"wrote {model_path} and init_latency_s in {cloud_path} ({took:.0f}s of profiling)")
    return 0


def _model_path(experiment: str) -> str:
    return yaml.safe_load(Path(experiment).read_text())["model_profile"]


def _cloud_path(experiment: str) -> str:
    return yaml.safe_load(Path(experiment).read_text())["cloud"]["profile"]


if __name__ == "__main__":
    sys.exit(main())
