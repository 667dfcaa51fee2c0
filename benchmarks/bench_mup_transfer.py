"""Benchmark: does the best learning rate found on a narrow μP surrogate stay the best at full
width? (issue #24, item 4)

The demo's trainer (``rubberband.examples.digits:DigitsMLP``, 64 -> hidden -> 10, SGD with
momentum 0.9) with its width knob ``hidden``. For each seed it sweeps the learning rate over
a 2^k grid and trains, in one process, for ``--steps`` optimizer steps of the trainer's batch:

- the standard parametrization (SP: the trainer's own code) at W, W/4 and W/8;
- μP at W with base shapes at W/S (``target_trainer(trainer, S)``), for S = 4 and 8.

μP's base *is* the surrogate (``surrogate_trainer``: all multipliers 1), so the surrogate's
best lr is SP's at W/S, and the question is whether μP's target at W agrees with it where SP
at W does not. It prints a markdown table of the best lr (log2) and the final val_loss there.

``--end-to-end`` also runs the demo's job (``experiments/demo.yaml``'s SHA and search space,
``--e2e-seeds`` of them) in process, twice: SHA on the full-width model; and SHA on the
surrogate (W/8) followed by the winner's config trained once at full width in μP (and, for
contrast, in SP). It prints each one's final val_loss and CPU seconds.

Measured (2 loaded CPU cores, 3 seeds, 150 steps): on DigitsMLP with SGD the best lr hardly
moves with width under SP either (seed-mean 2^-3 at 16, 2^-2 at 32 and 128; μP at 128: 2^-2),
so μP has little to fix there; with two hidden layers and Adam, SP drifts 2^-5 -> 2^-8 from
W/8 to W = 512 while μP stays within one octave (2^-6). Per-seed argmins are noisy (±1). The
end-to-end check (demo SHA, S = 8) picked the full-width winner in 1/3 seeds at hidden 128
and at 1024; the μP target's val_loss was -14%..+15% of full-width tuning's at 128, at no
CPU saving (per-step overhead dominates a 16-wide model), and +6%..+27% at 1024 for ~0.7x
the CPU; the same winner trained in SP did as well or better in 5 of 6 (val_loss ~0.02-0.03
on 360 samples: a few samples' worth).

Run: ``nice -n 19 .venv/bin/python benchmarks/bench_mup_transfer.py [--seeds 3] [--steps 150]
[--width 128] [--optimizer sgd|adam] [--model mlp|deep] [--metric train_loss|val_loss]
[--end-to-end]``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from rubberband.examples.digits import DigitsMLP  # noqa: E402
from rubberband.surrogate import surrogate_trainer, target_trainer  # noqa: E402

RATIOS = (4, 8)


class DigitsAdam(DigitsMLP):
    """The demo's MLP trained with Adam (for ``--optimizer adam``)."""

    def build_optimizer(self, model, config: dict[str, Any]):
        return torch.optim.Adam(model.parameters(), lr=float(config["lr"]),
                                weight_decay=float(config.get("weight_decay", 0.0)))


class DigitsDeep(DigitsMLP):
    """Two hidden layers, 64 -> hidden -> hidden -> 10 (for ``--model deep``): the shape the issue
    measured with the mup library, with a hidden (width x width) weight that DigitsMLP lacks."""

    def build_model(self, config: dict[str, Any]):
        import torch.nn as nn

        h = int(config["hidden"])
        return nn.Sequential(nn.Linear(64, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 10))


class DeepAdam(DigitsDeep):
    build_optimizer = DigitsAdam.build_optimizer


TRAINERS = {("mlp", "sgd"): DigitsMLP, ("mlp", "adam"): DigitsAdam, ("deep", "sgd"): DigitsDeep,
            ("deep", "adam"): DeepAdam}


class Trial:
    """One model trained in process: the worker's loop (``DDPWorker.train``) on one rank."""

    def __init__(self, trainer, config: dict[str, Any], data, seed: int):
        self.trainer, self.config = trainer, config
        self.train_set, self.val_set = data
        torch.manual_seed(seed)
        self.model = trainer.build_model(config)
        self.opt = trainer.build_optimizer(self.model, config)
        self.gen = torch.Generator().manual_seed(seed)
        self.x, self.y = self.train_set.tensors
        self.order: list[torch.Tensor] = []
        self.iters = 0

    def _batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.order:
            b = int(self.trainer.global_batch_size)
            perm = torch.randperm(len(self.y), generator=self.gen)
            self.order = list(perm[: len(perm) // b * b].split(b))
        idx = self.order.pop()
        return self.x[idx], self.y[idx]

    def train(self, steps: int) -> None:
        for _ in range(steps):
            x, y = self._batch()
            self.opt.zero_grad(set_to_none=True)
            self.trainer.loss(self.model(x), y).backward()
            self.opt.step()

    def train_iters(self, iters: int) -> float:
        self.train(iters * int(self.trainer.steps_per_iter))
        self.iters += iters
        return self.val_loss()

    def train_loss(self) -> float:
        """Mean loss on the whole training set (what μP's transfer plots show)."""
        with torch.no_grad():
            loss = float(self.trainer.loss(self.model(self.x), self.y))
        return loss if math.isfinite(loss) else math.inf

    def val_loss(self) -> float:
        loss = self.trainer.evaluate(self.model, self.val_set)["val_loss"]
        return loss if math.isfinite(loss) else math.inf


def sweep(trainer, width: int, lrs: list[float], args, data, seed: int) -> dict[float, float]:
    """Final loss (``--metric``) by lr for ``trainer`` built at config width ``width``."""
    out = {}
    for lr in lrs:
        trial = Trial(trainer, {"hidden": width, "lr": lr, "momentum": 0.9, "weight_decay": 0.0}, data, seed)
        trial.train(args.steps)
        out[lr] = trial.val_loss() if args.metric == "val_loss" else trial.train_loss()
    return out


def transfer_table(args, data) -> None:
    user = TRAINERS[args.model, args.optimizer]()
    W = args.width
    lrs = [2.0**k for k in range(args.lr_min, args.lr_max + 1)]
    columns = [(f"SP W/{s}={W // s}", lambda s=s: (user, W // s)) for s in sorted(RATIOS, reverse=True)]
    columns.append((f"SP W={W}", lambda: (user, W)))
    columns += [(f"μP W={W} (base W/{s})", lambda s=s: (target_trainer(user, s), W)) for s in sorted(RATIOS, reverse=True)]
    shape = "64->hidden->10" if args.model == "mlp" else "64->hidden->hidden->10"
    print(f"{type(user).__name__} {shape}, {args.optimizer}{' momentum 0.9' if args.optimizer == 'sgd' else ''}, "
          f"batch {user.global_batch_size}, {args.steps} steps, lr grid 2^{args.lr_min}..2^{args.lr_max}; "
          f"cells: log2(best lr) ({args.metric} there)\n")
    print("| seed | " + " | ".join(name for name, _ in columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    best: dict[str, list[float]] = {name: [] for name, _ in columns}
    curves: dict[str, list[dict[float, float]]] = {name: [] for name, _ in columns}
    t0 = time.process_time()
    for seed in range(args.seeds):
        cells = []
        for name, make in columns:
            trainer, width = make()
            curve = sweep(trainer, width, lrs, args, data, seed)
            loss, lr = min((v, k) for k, v in curve.items())
            best[name].append(math.log2(lr))
            curves[name].append(curve)
            cells.append(f"{math.log2(lr):+.0f} ({loss:.3f})")
        print(f"| {seed} | " + " | ".join(cells) + " |", flush=True)
    mean_best = {}
    for name, _ in columns:
        mean = {lr: statistics.fmean(c[lr] for c in curves[name]) for lr in lrs}
        loss, lr = min((v, k) for k, v in mean.items())
        mean_best[name] = math.log2(lr)
        best[name].append(math.log2(lr))
    print("| mean loss over seeds | " + " | ".join(
        f"{mean_best[n]:+.0f} ({min(statistics.fmean(c[lr] for c in curves[n]) for lr in lrs):.3f})"
        for n, _ in columns) + " |")
    print(f"\nCPU time: {time.process_time() - t0:.0f} s")
    for s in RATIOS:
        sur, sp, mu = best[f"SP W/{s}={W // s}"], best[f"SP W={W}"], best[f"μP W={W} (base W/{s})"]
        same_mu = sum(a == b for a, b in zip(sur[:-1], mu[:-1]))
        same_sp = sum(a == b for a, b in zip(sur[:-1], sp[:-1]))
        print(f"S = {s}: the surrogate's best lr is the full-width best in {same_mu}/{args.seeds} seeds under μP "
              f"(seed-mean curve: off by {mu[-1] - sur[-1]:+.0f} in log2), {same_sp}/{args.seeds} under SP "
              f"(off by {sp[-1] - sur[-1]:+.0f})")


def sha(trainer, configs: list[dict[str, Any]], stages, data, seed: int) -> tuple[dict[str, Any], float]:
    """Successive halving in process, as the scheduler runs it: each stage trains its trials
    ``iters`` more iterations and keeps the best ``n`` for the next. Returns the winner's
    config and its final val_loss."""
    trials = [Trial(trainer, c, data, seed) for c in configs]
    scored: list[tuple[float, int]] = []
    for n, iters in stages:
        trials = trials[:n] if not scored else [trials[i] for _, i in sorted(scored)[:n]]
        scored = [(t.train_iters(iters), i) for i, t in enumerate(trials)]
    loss, i = min(scored)
    return trials[i].config, loss


def end_to_end(args, data) -> None:
    from rubberband.config import load_experiment
    from rubberband.executor.search_space import sample_configs

    exp = load_experiment(ROOT / "experiments" / "demo.yaml")
    stages = [(s.num_trials, s.iters) for s in exp.spec.stages]
    total = sum(k for _, k in stages)        # a trial that survives every stage: max_iters
    user, S, W = DigitsMLP(), 8, args.width
    print(f"\nEnd to end: demo.yaml's SHA {exp.spec.describe()}, search space {', '.join(exp.search_space)}, "
          f"hidden {W}, surrogate at {W // S} (S = {S}); the target trains {total} iterations of "
          f"{user.steps_per_iter} steps\n")
    print("| seed | full-width SHA: val_loss | CPU s | surrogate SHA winner (lr, momentum, wd) | same winner | "
          "surrogate val_loss | μP target val_loss | SP target val_loss | surrogate SHA + μP target CPU s | "
          "μP target vs full-width |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for seed in range(args.e2e_seeds):
        configs = [{**c, "hidden": W} for c in sample_configs(exp.search_space, stages[0][0], seed)]
        t0 = time.process_time()
        full_winner, full_loss = sha(user, configs, stages, data, seed)
        full_cpu = time.process_time() - t0
        t0 = time.process_time()
        winner, sur_loss = sha(surrogate_trainer(user, S), configs, stages, data, seed)
        sur_cpu = time.process_time() - t0
        t0 = time.process_time()
        mu_loss = Trial(target_trainer(user, S), winner, data, seed).train_iters(total)
        target_cpu = time.process_time() - t0
        sp_loss = Trial(user, winner, data, seed).train_iters(total)
        cfg = f"{winner['lr']:.3g}, {winner['momentum']:.2f}, {winner['weight_decay']:g}"
        same = "yes" if winner == full_winner else "no"
        print(f"| {seed} | {full_loss:.4f} | {full_cpu:.1f} | {cfg} | {same} | {sur_loss:.4f} | {mu_loss:.4f} "
              f"| {sp_loss:.4f} | {sur_cpu:.1f} + {target_cpu:.1f} | {100 * (mu_loss / full_loss - 1):+.1f}% |",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150, help="optimizer steps per lr-sweep run")
    parser.add_argument("--width", type=int, default=128, help="the full width (hidden); divisible by 8")
    parser.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    parser.add_argument("--model", choices=["mlp", "deep"], default="mlp",
                        help="mlp: the demo's DigitsMLP; deep: two hidden layers")
    parser.add_argument("--metric", choices=["train_loss", "val_loss"], default="train_loss",
                        help="what the lr sweep ranks by at the end of training")
    parser.add_argument("--lr-min", type=int, default=-9, help="log2 of the smallest lr of the grid")
    parser.add_argument("--lr-max", type=int, default=1, help="log2 of the largest lr of the grid")
    parser.add_argument("--end-to-end", action="store_true", help="also tune the demo on surrogates vs at full width")
    parser.add_argument("--e2e-seeds", type=int, default=3)
    parser.add_argument("--skip-table", action="store_true", help="only the end-to-end check")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    data = DigitsMLP().build_data({})
    if not args.skip_table:
        transfer_table(args, data)
    if args.end_to_end:
        end_to_end(args, data)


if __name__ == "__main__":
    main()
