#!/usr/bin/env python
"""Measure the demo job on this machine and write the profiles the planner uses for it.

Starts a local cluster of the demo experiment's instance type, and measures with the real
executor pieces (the local provider, Ray's autoscaler, warm DDP worker gangs):

* initialisation, running -> ready with warm workers (real: raylet start plus worker warm-up),
  over two launches;
* per GPUs-per-trial count (1, 2, ... up to the instance's GPUs): trial start-up and seconds
  per iteration, from TRAIN durations of small stages run by the real driver (trials of k and
  of k + iters iterations, queued on one instance full of such gangs): d = startup + k * L.

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
    parser.add_argument("--iters", type=int, default=4, help="extra iterations of the long trials (>= 1)")
    parser.add_argument("--repeats", type=int, default=3, help="gang starts per GPU count")
    args = parser.parse_args(argv)
    if args.iters < 1:
        print("error: --iters must be at least 1", file=sys.stderr)
        return 2
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")

    import ray

    import rubberband as rb
    from rubberband.execute.driver import Driver
    from rubberband.execute.ray_runner import RayClusterPort, RayTrialRunner
    from rubberband.plan import plan_allocation
    from rubberband.providers.local import LocalCluster

    exp = rb.load_experiment(args.experiment)
    cloud = exp.cloud
    G = cloud.gpus_per_instance
    run_id = "measure-" + time.strftime("%H%M%S")
    run_dir = ROOT / "runs" / run_id
    t_start = time.time()
    cluster = LocalCluster.start(run_id, run_dir, cloud, max_instances=2, seed=exp.seed)
    init, startup, latency = [], [], {}
    try:
        ray.init(address=cluster.address, logging_level=logging.ERROR, log_to_driver=False)
        port = RayClusterPort(G, events=cluster.read_events, release_file=str(run_dir / "provider" / "release.json"))
        runner = RayTrialRunner(exp.trainer, seed=exp.seed)
        warmed: dict[str, float] = {}

        def on_event(kind, data):
            if kind == "nodes":
                for inst in data["instances"]:
                    warmed.setdefault(inst, data["at"])

        def mini_run(trials: int, iters: int, gpus: int) -> list[dict]:
            """One stage through the real driver: TRAIN durations as the executor sees them."""
            spec = rb.ExperimentSpec.from_stages([(trials, iters)])
            plan = plan_allocation(spec, (gpus,), exp.model.replace(iter_latency_s={1: exp.model.iter_latency_s[1]})
                                   if gpus <= trials else exp.model, cloud, deadline_s=3600, samples=10)
            driver = Driver(plan, port, runner, exp.search_space, exp.metric, exp.mode, seed=exp.seed,
                            on_event=on_event, keep_warm=True)
            return driver.run().train_runs

        # Two launches: request -> running is the provider's (emulated) provisioning;
        # running -> warm workers is initialisation.
        for count in (1, 2):
            mini_run(G * count, 1, G * count)
        for e in cluster.read_events():
            if e["event"] == "running" and e["instance"] in warmed:
                init.append(warmed[e["instance"]] - e["t"])
        print(f"initialisation (running -> warm workers): {', '.join(f'{x:.2f}s' for x in init)}", flush=True)
        nodes = port.nodes()
        for node in nodes[1:]:
            runner.release_instance(node.name)
        port.release_to([nodes[0].name], 0)
        port.wait_nodes(1, 120)
        m = 1
        while m <= min(G, exp.model.max_gpus):
            # Trials of k and 3k iterations queue on one instance full of m-GPU gangs; the TRAIN
            # durations d = startup + k L give L and the start-up by difference.
            per = {}
            for k in (1, 1 + args.iters):
                durations = []
                for _ in range(args.repeats):
                    runs = mini_run(2 * (G // m), k, G) if m == 1 else mini_run(1, k, m)
                    durations += [r["end_s"] - r["start_s"] for r in runs]
                per[k] = durations
            k0, k1 = sorted(per)
            iter_s = (statistics.fmean(per[k1]) - statistics.fmean(per[k0])) / (k1 - k0)
            start_s = max(0.0, statistics.fmean(per[k0]) - k0 * iter_s)
            spread = statistics.pstdev([d / k1 for d in per[k1]]) if len(per[k1]) > 1 else 0.0
            latency[m] = {"dist": "normal", "mean": round(iter_s, 4), "std": round(spread, 4)}
            startup.append(start_s)
            print(f"{m} GPU(s)/trial: start-up {start_s:.3f}s, iteration {iter_s:.4f}s +- {spread:.4f}", flush=True)
            m *= 2
        runner.shutdown()
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.stop()
    took = time.time() - t_start

    trainer_name = exp.trainer.split(":")[-1] if exp.trainer else "trainer"
    profile = {
        "name": Path(exp.model.name).name,
        "description": f"{trainer_name} on this machine's CPU, measured by scripts/measure_demo_profile.py",
        "measured_on": {"provider": "local", "instance_type": cloud.instance_type, "gpu_model": "logical",
                        "host": os.uname().nodename},
        "measured_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "rubberband_version": rb.__version__,
        "profiling": {"seconds": round(took, 1), "iters": args.iters, "repeats": args.repeats},
        "iter_latency_s": latency,
        "trial_startup_s": {"dist": "constant", "value": round(statistics.fmean(startup), 4)},
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
