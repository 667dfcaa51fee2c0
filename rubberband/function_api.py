"""Function trainables: a user's ``train_fn(config)`` in Ray Tune's style, run stage by stage.

A function trainable loops, calls ``report(metrics, checkpoint=...)`` once per iteration and
restores from ``get_checkpoint()`` when it starts. rubberband's own ``report``,
``get_checkpoint``, ``get_context`` and ``Checkpoint`` have Ray Tune 2.x's signatures, and a
function written against ``ray.tune`` runs unchanged: ``install_ray_hook`` puts a stand-in
session where Ray's reporting calls look for theirs (``ray.train._internal.session._session``,
read on every call; private to Ray, so pyproject pins Ray's minor version and
``tests/unit/test_function_api.py`` fails when it moves).

``FunctionSession`` hosts one run of the function on a thread. ``advance(n)`` lets it run
until it has reported ``n`` more iterations and pauses it inside that report; ``stop()``
makes the paused ``report`` raise ``TrialStopped`` (a ``BaseException``, so a function's
``except Exception`` does not swallow it) and joins the thread. This is how Ray Tune pauses a
trial, and how a stage boundary stops one: the trial resumes later, perhaps on another GPU
count in another process, by calling the function again with its latest reported checkpoint.

A trial's resumable state is ``pack_state``'s bytes: a one-line JSON header (the iteration its
checkpoint was reported at, the iterations counted as done, how far it got, and the iterations
it checkpointed at, which the profiler reads for ``checkpoint_every``) and a tar of the
checkpoint directory. When the checkpoint is older than the iterations counted — a function
that checkpoints every few reports, or never — the resumed function trains those iterations
again (``redone``) before it counts new ones.

**Iterations and ``time_attr``.** Without one, each ``report`` is one iteration (Ray Tune's
``training_iteration``). With an experiment's ``time_attr: NAME``, a trial's progress is its
reports' ``metrics[NAME]``, a counter that must never decrease (Ray Tune's ``time_attr`` for
its schedulers): a chunk of ``n`` iterations runs until the first report whose ``NAME``
reaches the trial's target, ``n`` more than the target before it (not more than where it got:
a report that overshoots the target does not move the next one), so a stage boundary falls at
the first report at or past the stage's end. A report every half epoch with ``time_attr:
epoch`` stops a 3-epoch stage at the report of epoch 3.0; a report every 2 epochs stops it at
epoch 4, and the next 3-epoch stage at the first report at or past 6. A chunk whose target a
previous report already passed trains nothing (``advance`` returns no reports). Redone
reports are those at or below where the trial had got before it was stopped.

torch is imported only by ``prepare_model`` / ``prepare_data_loader``; Ray only by the hook.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from rubberband.errors import RubberbandError

STATE_MAGIC = b"RBFN1 "


class TrialStopped(BaseException):
    """Raised inside a paused ``report`` when the trial is stopped (a stage boundary, or the
    end of the job); it unwinds the function. A ``BaseException``, like ``KeyboardInterrupt``."""


class TrialFunctionError(RubberbandError):
    """The trial's function raised, or returned before reporting the iterations asked for."""

    def __init__(self, message: str, traceback_text: str = ""):
        super().__init__(message)
        self.traceback_text = traceback_text

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        # Pickled across Ray with the user's traceback (Exception's own pickling keeps args only).
        return (type(self), (str(self), self.traceback_text))


# --- Checkpoint ---------------------------------------------------------------------------------
class Checkpoint:
    """A directory of files a function reports (Ray Tune's ``Checkpoint``, local directories).

    ``Checkpoint.from_directory(path)``, ``as_directory()`` (a context manager yielding a
    local path) and ``to_directory(path=None)`` (a copy; a new temporary directory when
    ``path`` is ``None``) behave as Ray's do for a local directory.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)

    @classmethod
    def from_directory(cls, path: str | os.PathLike) -> Checkpoint:
        return cls(path)

    def to_directory(self, path: str | os.PathLike | None = None) -> str:
        dest = os.fspath(path) if path is not None else tempfile.mkdtemp(prefix="rb-checkpoint-")
        shutil.copytree(self.path, dest, dirs_exist_ok=True)
        return dest

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        yield self.path

    def __repr__(self) -> str:
        return f"Checkpoint(path={self.path!r})"


def _tar_directory(path: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(path, arcname=".")
    return buf.getvalue()


def _untar(blob: bytes, dest: str) -> None:
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r") as tar:
        tar.extractall(dest, filter="data")


def _directory_of(checkpoint: Any) -> bytes:
    """The files of a reported checkpoint (rubberband's, Ray's, or any with ``as_directory``)."""
    if not hasattr(checkpoint, "as_directory"):
        raise TypeError(f"report(checkpoint=...): expected a Checkpoint (Checkpoint.from_directory(path)), "
                        f"got {type(checkpoint).__name__}")
    with checkpoint.as_directory() as path:
        return _tar_directory(os.fspath(path))


MAX_CHECKPOINTS_KEPT = 32   # checkpoint iterations a state lists (the first ones: enough to see the pace)


def _number(value: Any) -> int | float:
    """A progress value as JSON keeps it: an int when it is whole."""
    value = float(value)
    return int(value) if value.is_integer() else value


@dataclass(frozen=True)
class TrialState:
    """What a trial resumes from: its checkpoint's files (``None``: it never reported one),
    the iteration that checkpoint was reported at, the iterations counted as done, how far the
    trial got (``reached``, ``None``: ``counted``; past it only with a ``time_attr`` whose
    reports overshoot), the iterations it reported checkpoints at (the first
    ``MAX_CHECKPOINTS_KEPT``) and its last report's metrics."""

    files: bytes | None
    checkpoint_iteration: int | float
    counted: int
    reached: int | float | None = None
    checkpoints: tuple[int | float, ...] = ()
    metrics: dict[str, Any] | None = None

    @property
    def progress(self) -> int | float:
        """Where the trial had got when it stopped (its last report's iteration)."""
        return self.counted if self.reached is None else self.reached

    @property
    def behind(self) -> int | float:
        """Iterations the resumed function will train again."""
        return self.progress - self.checkpoint_iteration


def pack_state(state: TrialState) -> bytes:
    header = {"checkpoint_iteration": state.checkpoint_iteration, "counted": state.counted,
              "has_files": state.files is not None, "reached": state.progress,
              "checkpoints": list(state.checkpoints), "metrics": state.metrics or {}}
    return STATE_MAGIC + json.dumps(header).encode() + b"\n" + (state.files or b"")


def unpack_state(blob: bytes) -> TrialState:
    if not blob.startswith(STATE_MAGIC):
        raise ValueError("checkpoint: not a function trainable's checkpoint (was it written by a Trainer class?)")
    line, _, files = blob[len(STATE_MAGIC):].partition(b"\n")
    header = json.loads(line)
    counted = int(header["counted"])
    return TrialState(files if header["has_files"] else None, _number(header["checkpoint_iteration"]), counted,
                      _number(header.get("reached", counted)), tuple(_number(c) for c in header.get("checkpoints", ())),
                      header.get("metrics") or None)


# --- the context a function sees ----------------------------------------------------------------
@dataclass(frozen=True)
class TrialContext:
    """``get_context()``: the trial and the gang this worker is part of (Ray's names)."""

    trial_id: str = "trial"
    world_size: int = 1
    world_rank: int = 0
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    gpu_ids: tuple[str, ...] = ()
    experiment_name: str = ""
    trial_dir: str = ""

    def get_trial_id(self) -> str:
        return self.trial_id

    def get_trial_name(self) -> str:
        return self.trial_id

    def get_world_size(self) -> int:
        return self.world_size

    def get_world_rank(self) -> int:
        return self.world_rank

    def get_local_rank(self) -> int:
        return self.local_rank

    def get_local_world_size(self) -> int:
        return self.local_world_size

    def get_node_rank(self) -> int:
        return self.node_rank

    def get_gpu_ids(self) -> list[str]:
        """The GPUs this worker holds (logical ids on the local provider)."""
        return list(self.gpu_ids)

    def get_experiment_name(self) -> str:
        return self.experiment_name

    def get_trial_dir(self) -> str:
        return self.trial_dir


@dataclass
class Report:
    """One ``report`` call: the trial's iteration after it (its ``time_attr`` when the
    experiment names one), its metrics, the seconds since the function was resumed or last
    reported (its iteration time, checkpointing included), and whether it kept a checkpoint."""

    iteration: int | float
    metrics: dict[str, Any]
    seconds: float
    checkpointed: bool = False


def clean_metrics(metrics: Any) -> dict[str, Any]:
    """Metrics as plain JSON values: numbers (tensors and numpy scalars via ``.item()``),
    strings and booleans; anything else is dropped."""
    if not isinstance(metrics, dict):
        raise TypeError(f"report(metrics): expected a dict of metric values, got {type(metrics).__name__}")
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        if hasattr(value, "item") and callable(value.item):
            try:
                value = value.item()
            except (ValueError, RuntimeError):
                continue
        if isinstance(value, (bool, int, float, str)):
            out[str(key)] = value
    return out


# --- the session --------------------------------------------------------------------------------
_current: FunctionSession | None = None


class FunctionSession:
    """One run of a function trainable on a thread, paused at its reports (module docstring).

    Args:
        fn: the user's function, called as ``fn(config)``.
        config: the trial's configuration.
        context: what ``get_context()`` returns.
        state: what to resume from (``None``: a fresh trial).
        checkpoint_rank: only this rank's reported checkpoints are kept (rank 0's, as Ray
            Train persists); other ranks' are ignored.
        time_attr: the metric that counts the trial's iterations (module docstring); ``None``:
            one report is one iteration.
    """

    def __init__(self, fn: Callable[[dict[str, Any]], Any], config: dict[str, Any], context: TrialContext | None = None,
                 state: TrialState | None = None, checkpoint_rank: int = 0, time_attr: str | None = None):
        self.fn, self.config = fn, dict(config)
        self.context = context or TrialContext()
        self.keep_checkpoints = self.context.world_rank == checkpoint_rank
        self.time_attr = time_attr
        self._restore_dir: str | None = None
        self.iteration: int | float = 0  # the trial's progress: reports, or its time_attr
        self.counted = 0                 # iterations counted as done (the scheduler's)
        self.reached: int | float = 0    # where the trial had got when it was last paused
        self.files: bytes | None = None  # latest reported checkpoint's files
        self.files_iteration: int | float = 0
        self.checkpoints: list[int | float] = []   # iterations it checkpointed at (the first few)
        if state is not None:
            self.iteration = self.files_iteration = state.checkpoint_iteration if state.files is not None else 0
            self.counted = state.counted
            self.reached = state.progress
            self.files = state.files
            self.checkpoints = [c for c in state.checkpoints if c <= self.files_iteration]
            if state.files is not None:
                self._restore_dir = tempfile.mkdtemp(prefix="rb-restore-")
                _untar(state.files, self._restore_dir)
        self._last_metrics = dict(state.metrics or {}) if state is not None else {}
        self.model: Any = None           # what prepare_model returned (for parameter digests)
        self._cond = threading.Condition()
        self._goal = 0
        self._paused = False
        self._stopping = False
        self._finished = False
        self._error: BaseException | None = None
        self._traceback = ""
        self._reports: list[Report] = []
        self._mark = 0.0
        self._thread: threading.Thread | None = None

    # -- what the function calls (through report / get_checkpoint / get_context) --
    def loaded_checkpoint_dir(self) -> str | None:
        return self._restore_dir

    def _progress(self, clean: dict[str, Any]) -> int | float:
        """The trial's iteration after this report: one more, or its ``time_attr``."""
        if self.time_attr is None or (self.time_attr == "training_iteration" and self.time_attr not in clean):
            return self.iteration + 1       # Ray fills in training_iteration: the report count
        value = clean.get(self.time_attr)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise ValueError(f"report(metrics): no number under {self.time_attr!r}, the experiment's time_attr "
                             f"(got {value!r}); report it at every call, or remove time_attr from the experiment")
        if value < self.iteration:
            raise ValueError(f"report(metrics): {self.time_attr!r} went from {self.iteration} back to {value}; the "
                             "experiment's time_attr counts the trial's iterations and must never decrease")
        return _number(value)

    def report(self, metrics: dict[str, Any], checkpoint: Any = None) -> None:
        clean = clean_metrics(metrics)
        progress = self._progress(clean)
        kept = checkpoint is not None and self.keep_checkpoints
        if kept:
            self.files = _directory_of(checkpoint)
            self.files_iteration = progress
            if len(self.checkpoints) < MAX_CHECKPOINTS_KEPT and (not self.checkpoints or progress > self.checkpoints[-1]):
                self.checkpoints.append(progress)
        with self._cond:
            if self._stopping:
                raise TrialStopped()
            self.iteration = progress
            if self.time_attr in (None, "training_iteration"):
                clean.setdefault("training_iteration", self.iteration)
            self._reports.append(Report(self.iteration, clean, time.perf_counter() - self._mark, kept))
            if self.iteration >= self._goal:
                self._paused = True
                self._cond.notify_all()
                while self._paused and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    raise TrialStopped()
        self._mark = time.perf_counter()

    # -- what the worker calls --
    def _main(self) -> None:
        try:
            self.fn(self.config)
        except TrialStopped:
            pass
        except BaseException as exc:   # the user's code failed: the worker reports it
            self._error = exc
            self._traceback = traceback.format_exc()
        finally:
            with self._cond:
                self._finished = True
                self._cond.notify_all()

    def advance(self, iters: int) -> tuple[list[Report], list[Report]]:
        """Run until ``iters`` more iterations are counted; return the reports made again (the
        resumed function catching up with where it had got before) and the counted ones. With
        a ``time_attr``, the counted ones end at the first report at or past the target; none
        when an earlier report already passed it (module docstring).

        Raises:
            TrialFunctionError: the function raised, or returned before reporting enough.
        """
        global _current
        if iters < 1:
            raise ValueError(f"iters: must be at least 1, got {iters}")
        start = len(self._reports)
        goal = self.counted + int(iters)
        if self.iteration >= goal:
            self.counted = goal             # an earlier report (or its checkpoint) already got past this target
            return [], []
        with self._cond:
            self._goal = goal
            self._mark = time.perf_counter()
            _current = self
            if self._thread is None:
                self._thread = threading.Thread(target=self._main, name=f"rb-trial-{self.context.trial_id}", daemon=True)
                self._thread.start()
            else:
                self._paused = False
                self._cond.notify_all()
            while not (self._paused or self._finished):
                self._cond.wait(1.0)
        new = self._reports[start:]
        if self._error is not None:
            err = self._error
            raise TrialFunctionError(f"trial {self.context.trial_id}: the trial function raised "
                                     f"{type(err).__name__}: {err}", self._traceback)
        if not self._paused:
            raise TrialFunctionError(
                f"trial {self.context.trial_id}: the trial function returned after {self.iteration} report(s), but the "
                f"trial needs {self._goal}; keep calling report() until stopped (loop at least to the experiment's "
                f"max_iters)")
        redone = [r for r in new if r.iteration <= self.reached]
        counted = [r for r in new if r.iteration > self.reached]
        self.counted = self._goal
        self.reached = self.iteration
        return redone, counted

    def last_metrics(self) -> dict[str, Any]:
        """The latest report's metrics (a chunk that trained nothing reports these again)."""
        return dict(self._reports[-1].metrics) if self._reports else dict(self._last_metrics)

    def iter_times(self, counted: list[Report], iters: int) -> list[float]:
        """Seconds of each of a chunk's ``iters`` iterations: its reports' own without a
        ``time_attr`` (one report, one iteration), else the chunk's seconds spread evenly."""
        if self.time_attr is None:
            return [r.seconds for r in counted]
        total = sum(r.seconds for r in counted)
        return [total / iters] * iters

    def state(self) -> TrialState:
        """What to resume this trial from: its latest reported checkpoint, the count, where it
        got, and the iterations it checkpointed at."""
        return TrialState(self.files, self.files_iteration if self.files is not None else 0, self.counted,
                          self.reached, tuple(self.checkpoints), self.last_metrics() or None)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the function (it unwinds from its paused ``report``) and clean up."""
        global _current
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        if _current is self:
            _current = None
        if self._restore_dir is not None:
            shutil.rmtree(self._restore_dir, ignore_errors=True)
            self._restore_dir = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


def current_session(what: str) -> FunctionSession:
    if _current is None:
        raise RuntimeError(f"rubberband.{what}() is called outside a trial: run the function with "
                           "`rubberband run` (trainer: module:function in the experiment)")
    return _current


# --- the user's API (Ray Tune's signatures) -------------------------------------------------------
def report(metrics: dict[str, Any], *, checkpoint: Checkpoint | None = None) -> None:
    """Report one iteration's metrics, and optionally a checkpoint to resume from.

    Each call is one iteration of the trial (Ray Tune's ``training_iteration``). The call may
    pause the function (the TRAIN asked for is done) or not return at all (the trial stops,
    and resumes later from its latest checkpoint by calling the function again).
    """
    current_session("report").report(metrics, checkpoint=checkpoint)


def get_checkpoint() -> Checkpoint | None:
    """The checkpoint this run of the trial resumes from (``None``: start from scratch)."""
    path = current_session("get_checkpoint").loaded_checkpoint_dir()
    return None if path is None else Checkpoint.from_directory(path)


def get_context() -> TrialContext:
    """The trial id, world size and rank, and the GPUs of this worker."""
    return current_session("get_context").context


# --- data parallelism (Ray Train's prepare_*) ---------------------------------------------------
def get_device() -> Any:
    """The torch device of this worker: its GPU when CUDA is there (Ray gives each worker its
    own visible GPU), else the CPU."""
    import torch

    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def _world() -> tuple[int, int]:
    ctx = _current.context if _current is not None else TrialContext()
    return ctx.world_size, ctx.world_rank


def prepare_model(model: Any, move_to_device: bool = True, parallel_strategy: str | None = "ddp",
                  parallel_strategy_kwargs: dict[str, Any] | None = None) -> Any:
    """Move ``model`` to this worker's device and, when the trial has several workers, wrap it
    in ``DistributedDataParallel`` (gloo on CPU, NCCL on GPUs), as Ray Train's does."""
    import torch

    device = get_device()
    if move_to_device:
        model = model.to(device)
    world, _ = _world()
    if world > 1 and parallel_strategy is not None:
        if parallel_strategy != "ddp":
            raise ValueError(f"prepare_model: parallel_strategy {parallel_strategy!r} is not supported; use 'ddp' or None")
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError("prepare_model: the trial has several workers but no process group")
        kwargs = dict(parallel_strategy_kwargs or {})
        if device.type == "cuda":
            kwargs.setdefault("device_ids", [device.index or 0])
        model = torch.nn.parallel.DistributedDataParallel(model, **kwargs)
    if _current is not None:
        _current.model = model
    return model


class _DeviceLoader:
    """A data loader whose batches land on the worker's device; each pass over it is a new
    epoch of its ``DistributedSampler``."""

    def __init__(self, loader: Any, device: Any, move: bool):
        self.loader, self.device, self.move = loader, device, move
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)

    def _to(self, batch: Any) -> Any:
        if hasattr(batch, "to"):
            return batch.to(self.device, non_blocking=True)
        if isinstance(batch, (list, tuple)):
            return type(batch)(self._to(b) for b in batch)
        if isinstance(batch, dict):
            return {k: self._to(v) for k, v in batch.items()}
        return batch

    def __iter__(self) -> Iterator[Any]:
        set_epoch = getattr(getattr(self.loader, "sampler", None), "set_epoch", None)
        if callable(set_epoch):
            set_epoch(self.epoch)
        self.epoch += 1
        for batch in self.loader:
            yield self._to(batch) if self.move else batch


def prepare_data_loader(data_loader: Any, add_dist_sampler: bool = True, move_to_device: bool = True) -> Any:
    """Shard ``data_loader`` over the trial's workers and move its batches to the device.

    With ``w > 1`` workers it is rebuilt with a ``DistributedSampler`` (shuffled when the
    original shuffled) and a per-worker batch of ``batch_size / w``: unlike Ray Train, the
    global batch stays the loader's whatever GPU count a stage gives the trial, so a trial
    trains the same way on any allocation (the profiles are timed at a fixed global batch).
    """
    import torch
    from torch.utils.data import DataLoader, RandomSampler
    from torch.utils.data.distributed import DistributedSampler

    world, rank = _world()
    loader = data_loader
    if world > 1 and add_dist_sampler and not isinstance(getattr(loader, "sampler", None), DistributedSampler):
        batch = loader.batch_size
        if batch is None or batch % world:
            raise ValueError(f"prepare_data_loader: batch_size {batch} does not split over {world} workers; "
                             "use a multiple of the GPUs per trial")
        shuffle = isinstance(loader.sampler, RandomSampler)
        sampler: DistributedSampler[Any] = DistributedSampler(loader.dataset, num_replicas=world, rank=rank,
                                                              shuffle=shuffle, drop_last=loader.drop_last)
        loader = DataLoader(loader.dataset, batch_size=batch // world, sampler=sampler, num_workers=loader.num_workers,
                            collate_fn=loader.collate_fn, pin_memory=loader.pin_memory, drop_last=loader.drop_last,
                            worker_init_fn=loader.worker_init_fn, generator=loader.generator)
    device = get_device()
    return _DeviceLoader(loader, device, move_to_device and device != torch.device("cpu"))


# --- Ray Tune's calls, through Ray's session hook -----------------------------------------------
RAY_SESSION_MODULE = "ray.train._internal.session"
RAY_SESSION_ATTR = "_session"


class RaySessionShim:
    """What ``ray.tune.report`` / ``get_checkpoint`` / ``get_context`` read from Ray's
    session, answered by the current ``FunctionSession``."""

    def __init__(self, session: FunctionSession):
        self._session = session
        ctx = session.context
        self.world_rank, self.world_size = ctx.world_rank, ctx.world_size
        self.local_rank, self.local_world_size, self.node_rank = ctx.local_rank, ctx.local_world_size, ctx.node_rank
        self.trial_id = self.trial_name = ctx.trial_id
        self.experiment_name, self.trial_dir, self.run_id = ctx.experiment_name, ctx.trial_dir, ctx.trial_id
        self.trial_resources = None
        self.metadata: dict[str, Any] = {}
        self.accelerator = None

    @property
    def loaded_checkpoint(self) -> Any:
        path = self._session.loaded_checkpoint_dir()
        if path is None:
            return None
        from ray.tune import Checkpoint as RayCheckpoint

        return RayCheckpoint.from_directory(path)

    def report(self, metrics: dict[str, Any], checkpoint: Any = None) -> None:
        self._session.report(metrics, checkpoint=checkpoint)


def ray_session_module() -> Any:
    """Ray's private session module (``None`` without Ray); raises when the hook moved."""
    import importlib

    try:
        module = importlib.import_module(RAY_SESSION_MODULE)
    except ImportError:
        return None
    if not hasattr(module, RAY_SESSION_ATTR) or not callable(getattr(module, "get_session", None)):
        import ray

        raise RubberbandError(f"Ray {ray.__version__} moved its session hook ({RAY_SESSION_MODULE}.{RAY_SESSION_ATTR}); "
                              "ray.tune.report cannot reach rubberband: install the Ray version pyproject.toml pins, "
                              "or use rubberband.report")
    return module


def install_ray_hook(session: FunctionSession | None) -> bool:
    """Point Ray's session hook at ``session`` (``None``: clear it); whether Ray is there."""
    module = ray_session_module()
    if module is None:
        return False
    setattr(module, RAY_SESSION_ATTR, None if session is None else RaySessionShim(session))
    return True


def check_function(fn: Callable[..., Any], name: str) -> list[str]:
    """Check a function trainable as far as can be told without running it; return warnings.

    It must take one argument, ``config``. If no call in its source file passes
    ``checkpoint=`` (to ``report``), every stage after the first restarts it from scratch and
    trains again what it trained before: a warning (the run says how many were redone).

    Raises:
        SpecError: the function does not take exactly one required argument.
    """
    import ast
    import inspect

    from rubberband.errors import SpecError

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in params if p.kind in positional and p.default is p.empty]
    takes_any = any(p.kind in positional or p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    if len(required) > 1 or not takes_any:
        raise SpecError(f"trainer: {name} must take one argument, the trial's config (def {fn.__name__}(config): ...)")
    try:
        path = inspect.getsourcefile(fn)
        tree = ast.parse(open(path).read()) if path else None
    except (OSError, TypeError, SyntaxError):
        tree = None
    if tree is not None and not any(isinstance(node, ast.Call) and any(k.arg == "checkpoint" for k in node.keywords)
                                    for node in ast.walk(tree)):
        return [f"trainer: {name} never passes checkpoint= to report(): every stage after the first restarts it "
                "from scratch and trains again the iterations it had done (the run's trial records say how many)"]
    return []


def is_function_trainable(obj: Any) -> bool:
    """A plain callable taking ``config`` (not a ``Trainer`` class or instance)."""
    return callable(obj) and not isinstance(obj, type) and not hasattr(obj, "build_model")


__all__ = ["Checkpoint", "TrialContext", "TrialState", "FunctionSession", "TrialStopped", "TrialFunctionError",
           "report", "get_checkpoint", "get_context", "get_device", "prepare_model", "prepare_data_loader",
           "install_ray_hook", "is_function_trainable", "check_function", "pack_state", "unpack_state"]
