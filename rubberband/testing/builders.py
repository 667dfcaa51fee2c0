"""Builders of model and cloud profiles for tests: one place that says what a test's profile is,
by keyword, instead of a profile written out (or a YAML dict) in every test module.

Each builder returns the same frozen value ``ModelProfile``/``CloudProfile`` that a profile file
would load to; what a builder is not told stays at the dataclass's own default, so a test names
only what it depends on. A latency given as a number is a ``Constant``; any ``Distribution``
is taken as it is. Pure: no Ray, boto3 or torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from rubberband.profiles.cloud import Billing, BillingModel, CloudProfile, DataCost, Market
from rubberband.profiles.distributions import Constant, Distribution, Normal
from rubberband.profiles.model import ModelProfile
from rubberband.profiles.spot import SpotMarket, SpotTrace

Seconds = float | Distribution
"""A latency: a number of seconds (a ``Constant``) or a distribution."""


def latency(value: Seconds) -> Distribution:
    """``value`` as a distribution: a number is a ``Constant`` of that many seconds."""
    return value if isinstance(value, Distribution) else Constant(float(value))


def model_profile(iter_latency_s: Mapping[int, Seconds], *, startup_s: Seconds = 0.0, sync_s: Seconds = 0.0,
                  name: str = "model", packed_iter_latency_s: Mapping[int, Seconds] | None = None,
                  gpu_memory_gb_per_trial: float | None = None,
                  measured_on: str | Mapping[str, Any] | None = None,
                  fused_iter_latency_s: Mapping[int, Seconds] | None = None,
                  fused_memory_gb: Mapping[int, float] | None = None) -> ModelProfile:
    """A model profile.

    Args:
        iter_latency_s: seconds per iteration of one trial by GPUs per trial.
        startup_s: a trial's start-up (``trial_startup_s``).
        sync_s: one SYNC (``sync_s``).
        name: the profile's name.
        packed_iter_latency_s: one of ``k`` trials packed on a GPU, seconds per iteration, by ``k``.
        gpu_memory_gb_per_trial: one trial's peak GPU memory.
        measured_on: where it was measured; a string is an instance type.
        fused_iter_latency_s: one iteration of a whole group of ``F`` fused trials, seconds, by ``F``.
        fused_memory_gb: a fused group's peak GPU memory by ``F``.

    Returns:
        The profile, as ``ModelProfile.from_dict`` would build it from the same values.
    """
    where = {"instance_type": measured_on} if isinstance(measured_on, str) else dict(measured_on or {})
    return ModelProfile(
        {g: latency(v) for g, v in iter_latency_s.items()}, latency(startup_s), latency(sync_s), name=name,
        measured_on=where, packed_iter_latency_s={k: latency(v) for k, v in (packed_iter_latency_s or {}).items()},
        gpu_memory_gb_per_trial=gpu_memory_gb_per_trial,
        fused_iter_latency_s={f: latency(v) for f, v in (fused_iter_latency_s or {}).items()},
        fused_memory_gb=dict(fused_memory_gb or {}))


def scaling_model(one_gpu_s: float = 12.0, one_gpu_std_s: float = 1.2, *, gpus: Iterable[int] = (1, 2, 4, 8),
                  packed: Mapping[int, float] | None = None, startup_s: Seconds = 5.0, sync_s: Seconds = 1.0,
                  gpu_memory_gb_per_trial: float | None = 3.0, measured_on: str | None = "p3.16xlarge",
                  name: str = "m", fused: Mapping[int, float] | None = None,
                  fused_memory_gb: Mapping[int, float] | None = None) -> ModelProfile:
    """A model that scales over GPUs as the Figure 12 curve: on ``g`` GPUs an iteration takes
    ``N(one_gpu_s · f(g), one_gpu_std_s · f(g))`` with ``f(g) = 0.05 + 0.95 / g`` (5% serial).

    Args:
        one_gpu_s: mean seconds per iteration on one GPU.
        one_gpu_std_s: their standard deviation on one GPU.
        gpus: the GPU counts profiled.
        packed: one of ``k`` trials packed on a GPU, as a multiple ``packed[k]`` of the one-GPU
            latency (mean and deviation alike).
        fused: one iteration of a whole group of ``F`` fused trials, as a multiple ``fused[F]`` of
            the one-GPU latency (mean and deviation alike): ``F / fused[F]`` is the throughput gain.
        startup_s, sync_s, gpu_memory_gb_per_trial, measured_on, name, fused_memory_gb: as in
            :func:`model_profile`.
    """
    def curve(g: int) -> Normal:
        return Normal(one_gpu_s * (0.05 + 0.95 / g), one_gpu_std_s * (0.05 + 0.95 / g))

    return model_profile({g: curve(g) for g in gpus}, startup_s=startup_s, sync_s=sync_s, name=name,
                         packed_iter_latency_s={k: Normal(one_gpu_s * f, one_gpu_std_s * f)
                                                for k, f in (packed or {}).items()},
                         gpu_memory_gb_per_trial=gpu_memory_gb_per_trial, measured_on=measured_on,
                         fused_iter_latency_s={f: Normal(one_gpu_s * x, one_gpu_std_s * x)
                                               for f, x in (fused or {}).items()},
                         fused_memory_gb=fused_memory_gb)


def spot_market(rate_per_hour: float = 0.0, notice_s: float = 0.0, trace: SpotTrace | None = None) -> SpotMarket:
    """A spot market given explicitly, as a profile's ``spot:`` section gives it: a preemption
    ``rate_per_hour`` (or a ``trace``) and a reclaim ``notice_s``."""
    if trace is not None:
        return SpotMarket(notice_s, trace=trace, explicit=True)
    return SpotMarket(notice_s, rate_per_hour, explicit=True)


def cloud_profile(instance_type: str = "test.type", gpus_per_instance: int = 4, price_usd_per_hour: float = 12.24,
                  *, spot_price_usd_per_hour: float | None = None, market: Market | str = Market.ON_DEMAND,
                  spot: SpotMarket | None = None, per_function: bool = False, granularity_s: float = 1.0,
                  minimum_s: float = 60.0, provision_s: Seconds | None = None, init_s: Seconds | None = None,
                  dataset_gb: float = 0.0, usd_per_gb: float = 0.0, gpu_memory_gb: float | None = None,
                  **changes: Any) -> CloudProfile:
    """A cloud profile of one instance type.

    Args:
        instance_type: its name.
        gpus_per_instance: GPUs per instance (G).
        price_usd_per_hour: the on-demand price.
        spot_price_usd_per_hour: the spot price (none: no spot market).
        market: the market it is bought on.
        spot: the spot market's preemption model (default: never reclaimed).
        per_function: billed per function (its time running trials) rather than per instance;
            ``granularity_s`` and ``minimum_s`` are then ignored, as ``billing: {model: per_function}`` loads.
        granularity_s, minimum_s: per-instance billing: rounded up to ``granularity_s``, at least ``minimum_s``.
        provision_s: SCALE, launch to running (default: the profile's own, N(30, 5)).
        init_s: INIT, running to ready (default: the profile's own, 60).
        dataset_gb, usd_per_gb: the data each launch reads, and its price per GB.
        gpu_memory_gb: memory per GPU (what bounds packing).
        changes: any other ``CloudProfile`` field, as it is.

    Returns:
        The profile, as ``CloudProfile.from_dict`` would build it from the same values.
    """
    billing = Billing(BillingModel.PER_FUNCTION) if per_function else \
        Billing(BillingModel.PER_INSTANCE, granularity_s, minimum_s)
    fields: dict[str, Any] = {
        "spot_price_usd_per_hour": spot_price_usd_per_hour, "market": Market(market), "billing": billing,
        "data": DataCost(dataset_gb, usd_per_gb), "gpu_memory_gb": gpu_memory_gb,
    }
    if spot is not None:
        fields["spot"] = spot
    if provision_s is not None:
        fields["provision_latency_s"] = latency(provision_s)
    if init_s is not None:
        fields["init_latency_s"] = latency(init_s)
    return CloudProfile(instance_type, gpus_per_instance, price_usd_per_hour, **{**fields, **changes})


def spot_cloud(spot: SpotMarket | None = None, **changes: Any) -> CloudProfile:
    """A p3.8xlarge (4 V100s) bought on spot: $12.24 an hour on demand and $3.67 on spot,
    SCALE ~ N(30, 5) s, INIT ~ N(60, 10) s, 0.15 GB of data at $0.09 a GB per launch, billed
    per second with a 60 s minimum.

    Args:
        spot: the spot market (default: never reclaimed).
        changes: :func:`cloud_profile`'s keywords or any ``CloudProfile`` field, e.g.
            ``market=Market.ON_DEMAND``.
    """
    base: dict[str, Any] = {
        "instance_type": "p3.8xlarge", "gpus_per_instance": 4, "price_usd_per_hour": 12.24, "spot_price_usd_per_hour": 3.67, "market": Market.SPOT, "spot": spot if spot is not None else SpotMarket(),
        "provision_s": Normal(30.0, 5.0), "init_s": Normal(60.0, 10.0), "dataset_gb": 0.15, "usd_per_gb": 0.09,
    }
    return cloud_profile(**{**base, **changes})


def fake_cloud(gpus_per_instance: int = 1, **changes: Any) -> CloudProfile:
    """The type ``testing.fakes`` emulates in the driver's tests: ``fake.gpu`` at $3.60 an hour
    ($0.001 a second), SCALE 10 s and INIT 5 s (``make_fakes(..., provision_s=10, init_s=5)``).

    Args:
        gpus_per_instance: GPUs per instance (G).
        changes: :func:`cloud_profile`'s keywords or any ``CloudProfile`` field.
    """
    base: dict[str, Any] = {"instance_type": "fake.gpu", "price_usd_per_hour": 3.6, "provision_s": 10.0, "init_s": 5.0}
    return cloud_profile(gpus_per_instance=gpus_per_instance, **{**base, **changes})


def write_profile(path: str | Path, profile: ModelProfile | CloudProfile) -> Path:
    """Write ``profile`` as the YAML file its ``load`` reads back (for tests of the CLI, which
    takes profiles by path). Returns ``path``."""
    path = Path(path)
    path.write_text(yaml.safe_dump(profile.to_dict(), sort_keys=False))
    return path
