"""The experiment specification: stages of (trials, iterations), SHA and HyperBand generators."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rubberband.errors import SpecError
from rubberband.schema import check_mapping, did_you_mean


def _positive_int(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value != int(value):
        raise SpecError(f"{field}: expected a positive integer, got {value!r}")
    if int(value) <= 0:
        raise SpecError(f"{field}: must be a positive integer, got {value!r}")
    return int(value)


def _check_schedule(min_iters: int, max_iters: int, eta: object) -> None:
    """The checks SHA and HyperBand share: an integer ``eta >= 2`` and ``max_iters >= min_iters``."""
    if isinstance(eta, bool) or not isinstance(eta, int) or eta < 2:
        raise SpecError(f"eta: must be an integer of at least 2 (the reduction factor), got {eta!r}")
    if max_iters < min_iters:
        raise SpecError(f"max_iters: {max_iters} is below min_iters {min_iters}; set max_iters >= min_iters")


@dataclass(frozen=True)
class EagerTransfer:
    """Hydro's eager transfer of a surrogate job (DESIGN §4.6): the target stage starts at the
    SYNC that ends tuning stage ``after_stage``, on its own instances, with that SYNC's leader's
    config, while the tuning goes on; at the tuning's last SYNC it starts over from scratch with
    the winner's config if the winner is another trial. The model takes that to happen with
    ``restart_probability`` (``eager_transfer``'s default: ``1 - 1/n``, ``n`` the trials
    promoted at the hand-over, as if its ranking said nothing; 0 when one is promoted: it is the
    winner)."""

    after_stage: int
    restart_probability: float

    def __post_init__(self) -> None:
        stage = self.after_stage
        if isinstance(stage, bool) or not isinstance(stage, int) or stage < 0:
            raise SpecError(f"eager_transfer.after_stage: expected a tuning stage's index (0 or more), got {stage!r}")
        p = self.restart_probability
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise SpecError(f"eager_transfer.restart_probability: expected a probability from 0 to 1, got {p!r}")
        object.__setattr__(self, "restart_probability", float(p))

    def to_dict(self) -> dict[str, float]:
        return {"after_stage": self.after_stage, "restart_probability": self.restart_probability}


@dataclass(frozen=True)
class Stage:
    """One stage: ``num_trials`` trials each trained ``iters`` more iterations.

    ``target``: the full-width training after surrogate tuning (issue #24): one trial, the
    tuning's winner's config, trained ``iters`` iterations from scratch (not from a
    checkpoint) on the target model's own profile (``simulate(..., target_model=...)``).
    ``eager``: a target stage started early (``EagerTransfer``, DESIGN §4.6); ``None``: after
    the tuning's last SYNC.
    """

    num_trials: int
    iters: int
    target: bool = False
    eager: EagerTransfer | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_trials", _positive_int(self.num_trials, "num_trials"))
        object.__setattr__(self, "iters", _positive_int(self.iters, "iters"))
        if not isinstance(self.target, bool):
            raise SpecError(f"target: expected true or false, got {self.target!r}")
        if self.target and self.num_trials != 1:
            raise SpecError(f"num_trials: a target stage trains the one winning config, got {self.num_trials} trials")
        if self.eager is not None and (not self.target or not isinstance(self.eager, EagerTransfer)):
            raise SpecError("eager_transfer: only a target stage starts early; give an EagerTransfer with "
                            "ExperimentSpec.with_target(iters, eager=...)")


@dataclass(frozen=True)
class ExperimentSpec:
    """A tuning job as a sequence of barrier-separated stages (paper Figure 6).

    Stage ``i`` runs ``n_i`` trials for ``k_i`` more iterations each; a SYNC barrier ends each
    stage and promotes the best trials. ``bracket_starts`` lists the stages where a new set of
    trials is sampled (always stage 0; more for a HyperBand job run bracket after bracket).
    Within a bracket the trial count never grows.

    The object is immutable: ``add_stage`` returns a new spec, so calls chain.
    """

    stages: tuple[Stage, ...] = ()
    bracket_starts: tuple[int, ...] = (0,)
    eta: int | None = None

    def __post_init__(self) -> None:
        stages = tuple(s if isinstance(s, Stage) else Stage(*s) for s in self.stages)
        object.__setattr__(self, "stages", stages)
        starts = tuple(sorted(set(self.bracket_starts) | {0}))
        object.__setattr__(self, "bracket_starts", starts)
        if starts and stages and starts[-1] >= len(stages):
            raise SpecError(f"bracket_starts: {starts[-1]} is past the last stage ({len(stages) - 1})")
        if self.eta is not None and (isinstance(self.eta, bool) or not isinstance(self.eta, int) or self.eta < 2):
            raise SpecError(f"eta: must be an integer of at least 2, got {self.eta!r}")
        for i in range(1, len(stages)):
            if i not in starts and stages[i].num_trials > stages[i - 1].num_trials:
                raise SpecError(
                    f"stages[{i}].num_trials: {stages[i].num_trials} is more than the "
                    f"{stages[i - 1].num_trials} trials of stage {i - 1}; a stage can only keep "
                    "trials of the stage before it"
                )
        for i, stage in enumerate(stages):
            if stage.target and i != len(stages) - 1:
                raise SpecError(f"stages[{i}]: the target stage (the full-width training) must be the last stage; "
                                f"the job has {len(stages)} stages")
        eager = stages[-1].eager if stages else None
        if eager is not None:
            _check_eager(eager, stages[:-1], starts)

    # --- the paper's API -------------------------------------------------------------------
    def add_stage(self, num_trials: int, iters: int) -> ExperimentSpec:
        """Return a new spec with one more stage (chainable)."""
        return ExperimentSpec(self.stages + (Stage(num_trials, iters),), self.bracket_starts, self.eta)

    def with_target(self, iters: int, eager: EagerTransfer | None = None) -> ExperimentSpec:
        """This tuning job (on surrogates) followed by its target stage: the winner's config
        trained ``iters`` iterations at full width, from scratch (issue #24); with ``eager``
        (``eager_transfer``), started early (DESIGN §4.6).

        Raises:
            SpecError: ``iters`` not a positive integer (named ``surrogate.target_iters``), the
                job already ends in a target stage, or ``eager`` does not fit the tuning.
        """
        if self.target_stage is not None:
            raise SpecError("surrogate.target_iters: the job already ends in a target stage")
        try:
            stage = Stage(1, iters, target=True)
        except SpecError as err:
            raise SpecError(f"surrogate.target_iters: {err}") from None
        return ExperimentSpec(self.validate().stages + (Stage(1, stage.iters, True, eager),), self.bracket_starts,
                              self.eta)

    @property
    def eager(self) -> EagerTransfer | None:
        """The target stage's eager transfer (DESIGN §4.6), if the job ends in one started early."""
        return self.stages[-1].eager if self.stages else None

    def without_eager(self) -> ExperimentSpec:
        """The same job with its target stage after the tuning's last SYNC (itself when not eager)."""
        if self.eager is None:
            return self
        last = self.stages[-1]
        return ExperimentSpec(self.stages[:-1] + (Stage(1, last.iters, True),), self.bracket_starts, self.eta)

    @property
    def target_stage(self) -> int | None:
        """The index of the target stage (the last stage, when it is one), else ``None``."""
        return len(self.stages) - 1 if self.stages and self.stages[-1].target else None

    @property
    def tuning(self) -> ExperimentSpec:
        """The tuning stages alone: the job without its target stage (itself when it has none)."""
        if self.target_stage is None:
            return self
        return ExperimentSpec(self.stages[:-1], tuple(b for b in self.bracket_starts if b < len(self.stages) - 1),
                              self.eta)

    def num_stages(self) -> int:
        """Number of stages."""
        return len(self.stages)

    def get_stage(self, index: int) -> tuple[int, int]:
        """Return ``(num_trials, iters)`` of stage ``index``."""
        if not 0 <= index < len(self.stages):
            raise SpecError(f"stage index {index} out of range 0..{len(self.stages) - 1}")
        stage = self.stages[index]
        return stage.num_trials, stage.iters

    # --- derived ---------------------------------------------------------------------------
    @property
    def trials(self) -> tuple[int, ...]:
        """Trials per stage."""
        return tuple(s.num_trials for s in self.stages)

    @property
    def iters(self) -> tuple[int, ...]:
        """Iterations per trial, per stage."""
        return tuple(s.iters for s in self.stages)

    def total_iters(self) -> int:
        """Total trial-iterations of the job (the work, independent of GPUs)."""
        return sum(s.num_trials * s.iters for s in self.stages)

    def brackets(self) -> list[ExperimentSpec]:
        """Split a chained HyperBand job back into its SHA brackets."""
        tuning = self.tuning
        edges = list(tuning.bracket_starts) + [len(tuning.stages)]
        return [ExperimentSpec(tuning.stages[a:b], (0,), self.eta) for a, b in zip(edges, edges[1:])]

    def validate(self) -> ExperimentSpec:
        """Raise ``SpecError`` unless the spec has at least one stage; return self."""
        if not self.stages:
            raise SpecError("stages: the experiment has no stages; add one with add_stage(num_trials, iters)")
        return self

    def __len__(self) -> int:
        return len(self.stages)

    # --- generators ------------------------------------------------------------------------
    @classmethod
    def from_stages(cls, stages: Iterable[Sequence[int]]) -> ExperimentSpec:
        """Build a spec from ``[(num_trials, iters), ...]``."""
        spec = cls()
        for i, stage in enumerate(stages):
            if len(stage) != 2:
                raise SpecError(f"stages[{i}]: expected [num_trials, iters], got {stage!r}")
            spec = spec.add_stage(*stage)
        return spec.validate()

    @classmethod
    def sha(cls, num_trials: int, min_iters: int, max_iters: int, eta: int = 2) -> ExperimentSpec:
        """Successive Halving.

        Stage ``i`` keeps ``n_i = floor(n_{i-1} / eta)`` trials (``n_0 = num_trials``) and trains
        each ``min_iters * eta**i`` more iterations. The last stage is the first with a single
        trial, or fewer than ``eta`` trials, or whose budget would reach ``max_iters``; it trains
        its trials up to exactly ``max_iters`` iterations in total.

        Example: ``sha(64, 4, 508, 2)`` has stages (64,4) (32,8) (16,16) (8,32) (4,64) (2,128) (1,256).
        """
        num_trials = _positive_int(num_trials, "num_trials")
        min_iters = _positive_int(min_iters, "min_iters")
        max_iters = _positive_int(max_iters, "max_iters")
        _check_schedule(min_iters, max_iters, eta)
        stages: list[tuple[int, int]] = []
        n, done, i = num_trials, 0, 0
        while True:
            budget = min_iters * eta**i
            last = n == 1 or n < eta or done + budget >= max_iters
            k = max_iters - done if last else budget
            stages.append((n, k))
            if last:
                break
            done += k
            n //= eta
            i += 1
        return cls(tuple(Stage(*s) for s in stages), (0,), eta)

    @classmethod
    def hyperband(cls, min_iters: int, max_iters: int, eta: int = 3) -> list[ExperimentSpec]:
        """HyperBand (Li et al., 2018): the list of its SHA brackets, most exploratory first.

        With ``s_max = floor(log_eta(max_iters / min_iters))``, bracket ``s`` (from ``s_max`` down
        to 0) starts ``ceil((s_max + 1) / (s + 1) * eta**s)`` trials at
        ``max(min_iters, floor(max_iters / eta**s))`` iterations and is an SHA with ``eta``.
        """
        min_iters = _positive_int(min_iters, "min_iters")
        max_iters = _positive_int(max_iters, "max_iters")
        _check_schedule(min_iters, max_iters, eta)
        s_max = 0
        while min_iters * eta ** (s_max + 1) <= max_iters:
            s_max += 1
        brackets = []
        for s in range(s_max, -1, -1):
            n = math.ceil((s_max + 1) / (s + 1) * eta**s)
            r = max(min_iters, max_iters // eta**s)
            brackets.append(cls.sha(n, r, max_iters, eta))
        return brackets

    @classmethod
    def chain(cls, brackets: Sequence[ExperimentSpec]) -> ExperimentSpec:
        """Run brackets one after another as a single job (each starts fresh trials)."""
        stages: list[Stage] = []
        starts: list[int] = []
        for bracket in brackets:
            starts.append(len(stages))
            stages.extend(bracket.stages)
        etas = {b.eta for b in brackets}
        return cls(tuple(stages), tuple(starts), etas.pop() if len(etas) == 1 else None).validate()

    def describe(self) -> str:
        """A short human description, e.g. ``7 stages: 64x4 32x8 ...``."""
        body = " ".join(f"{s.num_trials}x{s.iters}" + (" (target)" if s.target else "") for s in self.stages)
        eager = self.eager
        if eager is not None:
            body += (f", the target started after stage {eager.after_stage} (eager transfer, restart "
                     f"probability {eager.restart_probability:.2g})")
        return f"{len(self.stages)} stages: {body}"


def _check_eager(eager: EagerTransfer, tuning: Sequence[Stage], starts: Sequence[int]) -> None:
    """An eager transfer fits the tuning before it: one bracket (SHA), a hand-over before the
    tuning's last stage, and no restart to model where one trial goes on (it is the winner)."""
    if len(starts) > 1:
        raise SpecError("eager_transfer: only an SHA job (one bracket) starts its target early; HyperBand's winner "
                        "is the best of every bracket's finalists, known only at the end; drop eager_transfer")
    s = eager.after_stage
    if s > len(tuning) - 2:
        raise SpecError(f"eager_transfer.after_stage: {s} is not before the tuning's last stage ({len(tuning) - 1}); "
                        f"hand over after stage {max(len(tuning) - 2, 0)} at the latest, or drop eager_transfer")
    if tuning[s + 1].num_trials == 1 and eager.restart_probability > 0:
        raise SpecError(f"eager_transfer.restart_probability: after stage {s} one trial goes on, the winner, so "
                        f"the target never restarts; give 0")


def eager_transfer(tuning: ExperimentSpec, after: float, restart_probability: float | None = None) -> EagerTransfer:
    """The ``EagerTransfer`` of an experiment's ``surrogate.eager_transfer``: the target starts at
    the first SYNC by which ``after`` of the tuning's trials are done (those not promoted), and
    restarts with ``restart_probability`` (default ``1 - 1/n``, ``n`` the trials promoted then).

    Raises:
        SpecError: ``after`` not in (0, 1), or no SYNC before the tuning's last stage gets that far.
    """
    if isinstance(after, bool) or not isinstance(after, (int, float)) or not 0.0 < after < 1.0:
        raise SpecError(f"surrogate.eager_transfer.after: expected the fraction of surrogate trials done before the "
                        f"target starts, above 0 and below 1, e.g. 0.5; got {after!r}")
    stages, first = tuning.validate().stages, tuning.stages[0].num_trials if tuning.stages else 0
    done = [(first - stages[i + 1].num_trials) / first for i in range(len(stages) - 1)]
    s = next((i for i, d in enumerate(done) if d >= after - 1e-12), None)
    if not done:
        raise SpecError("surrogate.eager_transfer: the tuning has one stage, so no SYNC comes before its end to hand "
                        "the target over at; drop eager_transfer")
    if s is None:
        raise SpecError(f"surrogate.eager_transfer.after: {after:g} of the trials are done only at the tuning's end "
                        f"(before its last stage at most {max(done):.3g}); give a smaller fraction, or drop "
                        "eager_transfer")
    promoted = stages[s + 1].num_trials
    p = 1.0 - 1.0 / promoted if restart_probability is None else restart_probability
    if promoted == 1 and restart_probability is not None and restart_probability != 0:
        raise SpecError(f"surrogate.eager_transfer.restart_probability: after stage {s} one trial goes on, the "
                        "winner, so the target never restarts; give 0, or a smaller fraction")
    try:
        return EagerTransfer(s, p)
    except SpecError as err:
        raise SpecError(f"surrogate.{err}") from None


# --- search: how each bracket's configs are drawn ---------------------------------------------------
# `search:` in an experiment (and TuneConfig's `search=`): `random` (default) draws each config
# independently, crossing grid axes; `grid` crosses grid axes, the trial count a multiple of the
# grid; `optuna` draws a bracket's configs from Optuna's TPE fitted on the rungs completed so far
# (BOHB-style). The samplers themselves are `rubberband/executor/search_space.py: SEARCHERS`.
SEARCH_ALGORITHMS = ("random", "grid", "optuna")


def search_algorithm(value: object, field: str = "search") -> str:
    """Check ``value`` names a search algorithm (``SEARCH_ALGORITHMS``).

    Raises:
        SpecError: one line naming ``field``, the closest name and the choices.
    """
    from rubberband.schema import choice

    return choice("random" if value is None else value, field, SEARCH_ALGORITHMS)


# --- surrogate tuning (issue #24) ----------------------------------------------------------------
# Hyperparameters μP does not carry across width (Hydro, OSDI '23; Yang et al. 2022): a name
# that contains one of these, listed under `transfer:`, draws a warning.
NOT_TRANSFERABLE = ("decay", "dropout", "drop_rate")


@dataclass(frozen=True)
class Surrogate:
    """Tune on a μP copy of the model ``width_ratio`` times narrower, then train the winner's
    config at full width (Hydro's surrogate tuning).

    ``transfer`` names the search-space keys whose tuned values carry over to the full width
    (learning rate, momentum, schedule, batch size); every other key of the search space is
    still tuned on the surrogate but does not transfer, and ``not_transferred`` names them.

    ``target_iters``: how long the target stage trains the winner at full width (``None``: as
    long as the tuning's longest trial, ``target_iters_for``). ``model_profile``: the path
    of the surrogate's own model profile as the experiment file gives it (the experiment's
    own ``model_profile`` is the full-width target's); ``config`` loads it.
    """

    width_ratio: int = 8
    transfer: tuple[str, ...] = ()
    target_iters: int | None = None
    model_profile: str | None = None
    eager_after: float | None = None            # ``eager_transfer``: the fraction of trials done first
    restart_probability: float | None = None    # the model's chance the target restarts (``eager_transfer``)

    def __post_init__(self) -> None:
        ratio = self.width_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, int) or ratio < 2:
            raise SpecError(f"surrogate.width_ratio: expected an integer of at least 2 (how many times narrower the "
                            f"surrogate is), got {ratio!r}")
        transfer = tuple(self.transfer)
        for name in transfer:
            if not isinstance(name, str) or not name:
                raise SpecError(f"surrogate.transfer: expected hyperparameter names, got {name!r}")
        twice = sorted({n for n in transfer if transfer.count(n) > 1})
        if twice:
            raise SpecError(f"surrogate.transfer: {', '.join(twice)} listed twice; list each name once")
        object.__setattr__(self, "transfer", transfer)
        if self.target_iters is not None:
            try:
                object.__setattr__(self, "target_iters", _positive_int(self.target_iters, "surrogate.target_iters"))
            except SpecError as err:
                raise SpecError(f"{err} (the full-width training's iterations)") from None

    def job(self, tuning: ExperimentSpec) -> ExperimentSpec:
        """The whole job: ``tuning`` followed by its target stage, started early with ``eager_after``."""
        eager = None if self.eager_after is None else eager_transfer(tuning, self.eager_after,
                                                                       self.restart_probability)
        try:
            return tuning.with_target(self.target_iters_for(tuning), eager)
        except SpecError as err:
            if str(err).startswith("eager_transfer"):       # the experiment file's field is surrogate.eager_transfer
                raise SpecError(f"surrogate.{err}") from None
            raise

    def target_iters_for(self, tuning: ExperimentSpec) -> int:
        """The target stage's iterations: ``target_iters``, or the most iterations any trial of
        ``tuning`` trains in all (a bracket's summed stage iterations; ``max_iters`` of an SHA)."""
        if self.target_iters is not None:
            return self.target_iters
        return max(sum(b.iters) for b in tuning.brackets())

    @classmethod
    def from_dict(cls, value: object, search_space: Mapping[str, object]) -> Surrogate:
        """The ``surrogate:`` mapping of an experiment file, checked against its search space.

        Raises:
            SpecError: unknown keys, a ratio below 2, or a ``transfer`` name that is not a key
                of ``search_space``.
        """
        data = check_mapping(value, "surrogate", required=["transfer"],
                             optional=["width_ratio", "target_iters", "model_profile", "eager_transfer"])
        transfer = data["transfer"]
        if not isinstance(transfer, list):
            raise SpecError(f"surrogate.transfer: expected a list of search_space keys such as [lr, momentum], "
                            f"got {transfer!r}")
        for name in transfer:
            if name not in search_space:
                raise SpecError(f"surrogate.transfer: {name!r} is not a key of search_space"
                                f"{did_you_mean(str(name), [str(k) for k in search_space])}; list only "
                                f"hyperparameters the search tunes ({', '.join(map(str, search_space)) or 'none'})")
        profile = data.get("model_profile")
        if profile is not None and (not isinstance(profile, str) or not profile.strip()):
            raise SpecError(f"surrogate.model_profile: expected the path of the surrogate's model profile (measured "
                            f"with `rubberband profile` at width / width_ratio), got {profile!r}")
        after, restart = _eager_fields(data.get("eager_transfer"))
        return cls(data.get("width_ratio", 8), tuple(transfer), data.get("target_iters"), profile, after, restart)

    def not_transferred(self, search_space: Iterable[str], width_keys: Iterable[str] = ()) -> tuple[str, ...]:
        """Search-space keys whose surrogate-tuned value does not carry over to full width: those
        not listed in ``transfer``, and any width key (the surrogate divides it)."""
        widths = set(width_keys)
        return tuple(k for k in search_space if k not in self.transfer or k in widths)

    def doubtful(self) -> tuple[str, ...]:
        """``transfer`` names that μP is known not to transfer (weight decay, dropout)."""
        return tuple(n for n in self.transfer if any(bad in n.lower() for bad in NOT_TRANSFERABLE))


def _eager_fields(value: object) -> tuple[float | None, float | None]:
    """``surrogate.eager_transfer``: a fraction (``0.5``) or ``{after: 0.5, restart_probability: 0.3}``."""
    if value is None:
        return None, None
    if isinstance(value, Mapping):
        data = check_mapping(value, "surrogate.eager_transfer", required=["after"], optional=["restart_probability"])
        return data["after"], data.get("restart_probability")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value, None
    raise SpecError(f"surrogate.eager_transfer: expected the fraction of surrogate trials done before the target "
                    f"starts (e.g. 0.5), or {{after: 0.5, restart_probability: 0.3}}; got {value!r}")
