"""One DDP worker of a trial: a Ray actor that builds the user's model and trains it.

A trial is a gang of these actors, one per GPU (logical GPUs on this machine), joined by a
torch.distributed process group — gloo on CPU, NCCL when CUDA is present. The global batch
size stays fixed whatever the gang's size: each of ``w`` workers processes ``B / w``
samples per optimizer step, in micro-batches of at most ``max_micro_batch`` with gradient
accumulation. Rank 0 evaluates and checkpoints; every rank restores from the checkpoint.

A function trainable (``trainer: module:function``, ``rubberband.function_api``) runs on a
thread of the worker instead: ``train(iters)`` lets it run until it has reported ``iters``
more iterations and pauses it in that report; ``checkpoint()`` is its latest reported
checkpoint (with the iteration it was reported at); ``assign`` starts it again from one, and
``leave`` stops it. Each report is one iteration; its time is the time since the one before.

A fused group (``rubberband.fusion``) is F trials of one model shape trained as one program on
this worker's one device: ``assign_group`` builds it (each member as ``assign`` would build it
alone, from its checkpoint), ``train`` feeds every member the batches a lone trial would see
and returns one result per member, ``checkpoint_group`` returns one ``checkpoint()`` blob per
member (an unfused worker resumes any of them), and ``leave`` drops it.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import io
import os
import re
import socket
import time
from datetime import timedelta
from typing import Any

from rubberband import function_api
from rubberband.errors import SpecError


def load_trainer(trainer: Any):
    """Instantiate a trainer from ``module:Name``, ``path/file.py:Name``, a class or an instance."""
    if not isinstance(trainer, str):
        return trainer() if isinstance(trainer, type) else trainer
    module_name, _, attr = trainer.partition(":")
    if not attr:
        raise SpecError(f"trainer: expected `module:Name`, got {trainer!r}")
    try:
        if module_name.endswith(".py"):
            spec = importlib.util.spec_from_file_location(f"rb_user_trainer_{abs(hash(module_name))}", module_name)
            if spec is None or spec.loader is None:
                raise ImportError(f"no Python module at {module_name}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
        cls = getattr(module, attr)
    except (ImportError, AttributeError, FileNotFoundError) as exc:
        raise SpecError(f"trainer: cannot load {trainer!r}: {exc}") from None
    return cls() if isinstance(cls, type) else cls


class DDPWorker:
    """A warm worker on one GPU of one instance (wrapped with ``ray.remote`` by the runner).

    Workers outlive trials: the runner keeps them warm per instance (torch imported, the
    trainer's ``prepare`` done) and hands them to trial after trial. A gang of ``m`` workers
    on one instance ``join`` a process group, ``assign`` builds the trial's model (wrapped in
    DDP when the gang has several workers) and restores its checkpoint, and ``leave``
    dissolves the group again.
    """

    def __init__(self, trainer: Any, seed: int, time_attr: str | None = None):
        import torch

        torch.set_num_threads(1)
        # Denormal floats make CPU arithmetic many times slower, and only for some configs
        # (small weights, weight decay): flushing them keeps a trial's speed config-independent.
        torch.set_flush_denormal(True)
        self.trainer = load_trainer(trainer)
        # A function trainable: run on a thread, paused at its reports (function_api).
        self.function = self.trainer if function_api.is_function_trainable(self.trainer) else None
        self.session: function_api.FunctionSession | None = None
        self.time_attr = time_attr      # the metric that counts a function's iterations (None: its reports)
        self.ray_hook = False           # whether Ray's tune.report is routed to the session
        self.seed = seed
        self.rank, self.world = 0, 1
        self.config: dict[str, Any] = {}
        self.step = self.epoch = 0
        # torch objects, built by the user's trainer (None until a trial is assigned).
        self.model: Any = None
        self.ddp: Any = None
        self.opt: Any = None
        self.train_set: Any = None
        self.val_set: Any = None
        self._data_config: dict[str, Any] | None = None
        self._batches: Any = None
        self._per_epoch = 1             # optimizer steps per epoch of the trial's batch stream
        self.distributed = False
        self.group: Any = None          # a rubberband.fusion.FusedGroup while one is assigned
        self.trials: list[str] = []     # its members' trial ids

    def warmup(self) -> float:
        """Import what training needs, once per process; return seconds taken."""
        t0 = time.perf_counter()
        import torch
        import torch.distributed  # noqa: F401
        import torch.nn.parallel  # noqa: F401

        # A process's first optimizer imports torch._dynamo (about a second): pay it here, not
        # in the first trial's start-up, which the profile measures on warm workers.
        torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        if self.function is not None:
            # Ray's tune.report reaches the session through Ray's session module: import it now
            # (about a second) if the function's module names Ray, not in a trial's start-up.
            self.ray_hook = _names_ray(self.function) and function_api.ray_session_module() is not None
            return time.perf_counter() - t0
        prepare = getattr(self.trainer, "prepare", None)
        if callable(prepare):
            prepare()
        if not getattr(self.trainer, "data_depends_on_config", True):
            self.train_set, self.val_set = self.trainer.build_data({})
            self._data_config = {}
        return time.perf_counter() - t0

    def node_info(self) -> dict[str, Any]:
        import ray

        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "pid": os.getpid()}

    def _gpu_ids(self) -> list[str]:
        """This worker's GPUs as Ray gave them (none outside a Ray worker)."""
        try:
            import ray

            return [str(g) for g in ray.get_gpu_ids()] if ray.is_initialized() else []
        except Exception:
            return []

    def free_port(self) -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    def join(self, rank: int, world: int, master_port: int) -> None:
        """Join a gang's process group: gloo on CPU, NCCL when CUDA is present."""
        import torch
        import torch.distributed as dist

        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{master_port}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=60))
        self.rank, self.world, self.distributed = rank, world, True

    def assign(self, config: dict[str, Any], checkpoint: bytes | None, trial: str | None = None) -> float:
        """Take a trial: build its model and optimizer and restore its checkpoint (a function
        trainable: get ready to call it, resuming from its checkpoint)."""
        import torch

        t0 = time.perf_counter()
        if self.function is not None:
            self._assign_function(config, checkpoint, trial)
            return time.perf_counter() - t0
        self.ddp = self.opt = self.model = self.group = None
        self.config, self.step, self.epoch = dict(config), 0, 0
        torch.manual_seed(self.seed)
        depends = getattr(self.trainer, "data_depends_on_config", True)
        if self.train_set is None or (depends and self._data_config != self.config):
            self.train_set, self.val_set = self.trainer.build_data(self.config)
            self._data_config = dict(self.config)
        self.model = self.trainer.build_model(self.config)
        self.opt = self.trainer.build_optimizer(self.model, self.config)
        if checkpoint is not None:
            state = torch.load(io.BytesIO(checkpoint), weights_only=False)
            self.model.load_state_dict(state["model"])
            self.opt.load_state_dict(state["optimizer"])
            self.step, self.epoch = int(state["step"]), int(state["epoch"])
        self.ddp = torch.nn.parallel.DistributedDataParallel(self.model) if self.distributed else self.model
        self._batches = self._batch_iter()
        return time.perf_counter() - t0

    def _assign_function(self, config: dict[str, Any], checkpoint: bytes | None, trial: str | None) -> None:
        import torch

        self._stop_function()
        self.config = dict(config)
        state = function_api.unpack_state(checkpoint) if checkpoint is not None else None
        context = function_api.TrialContext(trial_id=trial or "trial", world_size=self.world, world_rank=self.rank,
                                            local_rank=self.rank, local_world_size=self.world,
                                            gpu_ids=tuple(self._gpu_ids()))
        torch.manual_seed(self.seed)
        assert self.function is not None
        self.session = function_api.FunctionSession(self.function, self.config, context, state, time_attr=self.time_attr)
        if self.ray_hook:
            function_api.install_ray_hook(self.session)

    def _train_function(self, iters: int) -> dict[str, Any]:
        assert self.session is not None, "train() before assign()"
        redone, counted = self.session.advance(int(iters))
        self.step = int(self.session.iteration)
        out: dict[str, Any] = {"step": self.step, "iter_times": self.session.iter_times(counted, int(iters)),
                               "redone": len(redone), "redo_s": sum(r.seconds for r in redone),
                               "digest": self.param_digest(), "gpu_ids": self._gpu_ids()}
        if self.rank == 0:     # (a chunk a time_attr report already passed trains nothing: the last metrics)
            out["metrics"] = self.session.last_metrics()
        return out

    def _stop_function(self) -> None:
        if self.session is not None:
            self.session.stop()
            self.session = None
        if self.ray_hook:
            function_api.install_ray_hook(None)

    def _batches_per_epoch(self, sampler: Any) -> int:
        """Optimizer steps per epoch: this rank's share of the data in whole per-rank batches
        (``drop_last``), the same on every rank."""
        B = int(self.trainer.global_batch_size)
        if B % self.world:
            raise SpecError(f"global_batch_size: {B} is not divisible by {self.world} workers; use a multiple")
        per_epoch = len(sampler) // (B // self.world)
        if per_epoch < 1:
            raise SpecError(f"global_batch_size: {B} is more than the {len(self.train_set)} training samples "
                            f"({len(sampler)} per worker of {self.world}); use a smaller batch")
        return per_epoch

    def _batch_iter(self):
        """The trial's batches from its current optimizer step on, a function of that step alone.

        Epoch ``e`` is the ``DistributedSampler``'s permutation for ``e`` (seeded with the
        worker's seed; each rank takes its shard of it), cut into ``batches_per_epoch`` per-rank
        batches; step ``s`` trains on batch ``s % batches_per_epoch`` of epoch
        ``s // batches_per_epoch``. So a trial resumed from a checkpoint at step ``s`` sees the
        batches it would have seen had it never stopped, fused or not; the batches skipped to
        get there are never loaded. ``self.epoch`` is the epoch of the next step's batch
        (``s // batches_per_epoch``; checkpoints keep it, but only the step positions a resume).
        """
        from torch.utils.data import DataLoader
        from torch.utils.data.distributed import DistributedSampler

        b = int(self.trainer.global_batch_size) // max(self.world, 1)
        sampler: DistributedSampler[Any] = DistributedSampler(self.train_set, num_replicas=self.world, rank=self.rank,
                                                              shuffle=True, seed=self.seed, drop_last=True)
        per_epoch = self._per_epoch = self._batches_per_epoch(sampler)
        first, skip = divmod(int(self.step), per_epoch)
        self.epoch = first

        def batches():
            epoch, start = first, skip
            while True:
                sampler.set_epoch(epoch)
                order = list(iter(sampler))
                # A batch sampler of index lists: the DataLoader fetches and collates exactly the
                # batches a ``batch_size=b, drop_last=True`` loader over the sampler would.
                yield from DataLoader(self.train_set, batch_sampler=[order[k * b:(k + 1) * b]
                                                                     for k in range(start, per_epoch)])
                epoch, start = epoch + 1, 0

        return batches()

    def train(self, iters: int) -> dict[str, Any]:
        """Run ``iters`` iterations of ``steps_per_iter`` optimizer steps; rank 0 also evaluates
        (a function trainable: ``iters`` more reports; rank 0's last report's metrics)."""
        import contextlib

        if self.function is not None:
            return self._train_function(iters)
        if self.group is not None:
            return self._train_group(iters)     # type: ignore[return-value]

        micro = getattr(self.trainer, "max_micro_batch", None)
        times = []
        for _ in range(int(iters)):
            t0 = time.perf_counter()
            for _ in range(int(self.trainer.steps_per_iter)):
                x, y = next(self._batches)
                chunks = list(zip(x.split(micro), y.split(micro))) if micro else [(x, y)]
                self.opt.zero_grad(set_to_none=True)
                for j, (cx, cy) in enumerate(chunks):
                    sync = j == len(chunks) - 1 or not self.distributed
                    ctx = contextlib.nullcontext() if sync else self.ddp.no_sync()
                    with ctx:
                        loss = self.trainer.loss(self.ddp(cx), cy) * (len(cy) / len(y))
                        loss.backward()
                self.opt.step()
                self.step += 1
            times.append(time.perf_counter() - t0)
        self.epoch = self.step // self._per_epoch
        out: dict[str, Any] = {"step": self.step, "iter_times": times, "digest": self.param_digest(),
                               "gpu_ids": self._gpu_ids()}
        if self.rank == 0:
            out["metrics"] = self.trainer.evaluate(self.model, self.val_set)
        return out

    def checkpoint(self) -> bytes:
        if self.session is not None:
            return function_api.pack_state(self.session.state())
        if self.group is not None:
            raise SpecError("checkpoint(): this worker trains a fused group; call checkpoint_group()")
        import torch

        buf = io.BytesIO()
        torch.save({"model": self.model.state_dict(), "optimizer": self.opt.state_dict(), "step": self.step,
                    "epoch": self.epoch, "config": self.config}, buf)
        return buf.getvalue()

    def param_digest(self) -> list[float]:
        """Sum and sum of squares of all parameters (equal across ranks of a healthy gang); a
        function trainable's are its ``prepare_model`` model's (without one: the step alone)."""
        import torch

        model = self.model
        if self.function is not None:
            model = self.session.model if self.session is not None else None
            if model is None:
                return [float(self.step)]
        with torch.no_grad():
            flat = torch.cat([p.detach().flatten().double().cpu() for p in model.parameters()])
        return [float(flat.sum()), float((flat * flat).sum()), self.step]

    def leave(self) -> None:
        """Drop the trial and dissolve the process group (back to a lone warm worker)."""
        # Free DDP before destroying the group: the other order can hang in gloo's destructor.
        import torch.distributed as dist

        self._stop_function()      # before the group goes: the function's model may be DDP
        self.ddp = self.opt = self.model = self.group = None
        self.trials = []
        self._batches = None
        if self.distributed and dist.is_initialized():
            dist.destroy_process_group()
        self.rank, self.world, self.distributed = 0, 1, False


    # --- a fused group --------------------------------------------------------------------------
    def assign_group(self, trials: list[str], configs: list[dict[str, Any]],
                     checkpoints: list[bytes | None] | None = None, forward: str = "auto") -> float:
        """Take F trials as one fused group on this worker's device; return seconds taken.

        Each member is built as ``assign`` builds a lone trial (same seed, then its checkpoint);
        all share this worker's batch stream, positioned at their step (as ``assign`` positions a
        lone trial's), so the data must not depend on the config and the members must be at one
        step (a SYNC's survivors are). ``forward``: ``FusedGroup``'s
        (``auto``: batched layers where they cover the model, else ``torch.func.vmap``).

        Raises:
            SpecError: a function trainable, a gang of several workers, config-dependent data,
                members of different shapes or at different steps.
        """
        import torch

        from rubberband.fusion import FusedGroup

        t0 = time.perf_counter()
        if self.function is not None:
            raise SpecError("trainer: a function trainable runs its own loop and cannot be fused; run it unfused")
        if self.distributed:
            raise SpecError("assign_group: a fused group runs on one worker; leave() the gang first")
        if len(trials) != len(configs):
            raise SpecError(f"assign_group: {len(trials)} trials but {len(configs)} configs")
        if getattr(self.trainer, "data_depends_on_config", True):
            raise SpecError("trainer.data_depends_on_config: a fused group shares one batch stream; set it to "
                            "False (when the data does not depend on the config) to fuse")
        self.ddp = self.opt = self.model = self.group = None
        self._batches = None
        if self.train_set is None:
            torch.manual_seed(self.seed)
            self.train_set, self.val_set = self.trainer.build_data({})
            self._data_config = {}
        self.group = FusedGroup(self.trainer, configs, checkpoints, seed=self.seed, forward=forward)
        if self.group.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.group.device)
        self.trials = list(trials)
        self.config, self.step = {}, self.group.step
        self._batches = self._batch_iter()
        self.group.epoch = self.epoch
        return time.perf_counter() - t0

    def _train_group(self, iters: int) -> list[dict[str, Any]]:
        """``iters`` iterations of every member; per member (in ``assign_group``'s order) what
        ``train`` returns for a lone trial, plus ``trial``; ``iter_times`` are the group's."""
        group = self.group
        micro = getattr(self.trainer, "max_micro_batch", None)
        times = []
        for _ in range(int(iters)):
            t0 = time.perf_counter()
            for _ in range(int(self.trainer.steps_per_iter)):
                x, y = next(self._batches)
                group.train_step(x, y, micro)
            times.append(time.perf_counter() - t0)
        self.step = group.step
        self.epoch = group.epoch = self.step // self._per_epoch
        gpu_ids = self._gpu_ids()
        return [{"trial": trial, "step": self.step, "iter_times": list(times), "metrics": metrics,
                 "digest": digest, "gpu_ids": gpu_ids}
                for trial, metrics, digest in zip(self.trials, group.evaluate(self.val_set), group.digests())]

    def peak_memory_gb(self) -> float:
        """The fused group's peak memory: on CUDA the allocator's peak since ``assign_group``;
        on CPU this process's peak resident set (it never falls, so measure growing groups)."""
        import resource

        import torch

        device = self.group.device if self.group is not None else torch.device("cpu")
        if device.type == "cuda":
            return torch.cuda.max_memory_allocated(device) / 1e9
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6     # KiB on Linux

    def fusable(self, configs: list[dict[str, Any]]) -> tuple[list[list[int]], str | None]:
        """Which of ``configs`` can share a fused group here: their indices grouped by model
        shape (``rubberband.fusion.group_by_shape``), and why the largest group cannot be fused
        (``why_not_fusable``, tried on this worker's data), or ``None`` if it can."""
        from rubberband.fusion import group_by_shape, why_not_fusable

        if self.function is not None:
            return [list(range(len(configs)))], why_not_fusable(self.function, configs)
        groups = sorted(group_by_shape(self.trainer, configs), key=len, reverse=True)
        return groups, why_not_fusable(self.trainer, [configs[i] for i in groups[0]], seed=self.seed)

    def group_paths(self) -> tuple[str, str]:
        """How the fused group runs: its forward (``batched`` or ``vmap``) and optimizer step."""
        if self.group is None:
            raise SpecError("group_paths(): no fused group assigned; call assign_group() first")
        return self.group.forward_path, self.group.optimizer_path

    def checkpoint_group(self) -> list[bytes]:
        """One ``checkpoint()`` blob per member, in ``assign_group``'s order."""
        if self.group is None:
            raise SpecError("checkpoint_group(): no fused group assigned; call assign_group() first")
        self.group.epoch = self.epoch
        return self.group.checkpoints()


def _names_ray(fn: Any) -> bool:
    """Whether ``fn`` may call ``ray.tune.report``: its module holds something of Ray's (``from
    ray import tune``, ``import ray``, ``from ray.tune import report``), or its own source
    names Ray (an import inside the function)."""
    for value in list(getattr(fn, "__globals__", {}).values()):
        name = value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", None)
        if isinstance(name, str) and (name == "ray" or name.startswith("ray.")):
            return True
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return True      # no source to read: assume it might
    return re.search(r"\bray\b", source) is not None
