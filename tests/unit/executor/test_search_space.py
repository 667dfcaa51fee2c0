"""sample_configs: one seed gives one set of configs, from YAML samplers, lists, constants
and duck-typed Ray Tune domains."""

from __future__ import annotations

import numpy as np
import pytest

from rubberband.errors import SpecError
from rubberband.executor.search_space import sample_configs

SPACE = {
    "lr": {"loguniform": [1e-4, 1e-1]},
    "momentum": {"uniform": [0.8, 0.99]},
    "batch": {"choice": [32, 64, 128]},
    "layers": {"randint": [1, 5]},
    "dropout": {"quniform": [0.0, 0.5, 0.1]},
    "noise": {"randn": [0.0, 1.0]},
    "width": [128, 256],
    "optimizer": "sgd",
}


def column(space: dict, name: str, num: int = 2000, seed: int = 0) -> list:
    return [c[name] for c in sample_configs(space, num, seed=seed)]


def test_the_same_seed_gives_the_same_configs():
    assert sample_configs(SPACE, 20, seed=3) == sample_configs(SPACE, 20, seed=3)


def test_a_different_seed_gives_different_configs():
    a, b = sample_configs(SPACE, 20, seed=3), sample_configs(SPACE, 20, seed=4)
    assert [c["lr"] for c in a] != [c["lr"] for c in b]


def test_every_key_is_sampled_and_values_are_plain_python():
    for config in sample_configs(SPACE, 50, seed=1):
        assert set(config) == set(SPACE)
        assert type(config["lr"]) is float and type(config["layers"]) is int
        assert type(config["batch"]) is int and type(config["width"]) is int
        assert config["optimizer"] == "sgd"


def test_uniform_and_choice_stay_in_their_domain():
    momentum = column({"m": {"uniform": [0.8, 0.99]}}, "m")
    assert min(momentum) >= 0.8 and max(momentum) <= 0.99
    assert np.mean(momentum) == pytest.approx(0.895, abs=0.01)
    assert set(column({"b": {"choice": [32, 64, 128]}}, "b")) == {32, 64, 128}
    assert set(column({"w": [128, 256]}, "w")) == {128, 256}


def test_loguniform_is_within_bounds_and_uniform_in_log_space():
    lrs = np.array(column({"lr": {"loguniform": [1e-4, 1e-1]}}, "lr"))
    assert lrs.min() >= 1e-4 and lrs.max() <= 1e-1
    decades = np.histogram(np.log10(lrs), bins=[-4, -3, -2, -1])[0] / len(lrs)
    assert decades == pytest.approx([1 / 3] * 3, abs=0.05)     # a uniform draw would put ~90% in the top decade


def test_randint_excludes_its_upper_bound():
    assert set(column({"n": {"randint": [1, 5]}}, "n")) == {1, 2, 3, 4}


def test_quniform_gives_multiples_of_q():
    values = column({"d": {"quniform": [0.0, 0.5, 0.1]}}, "d")
    assert all(abs(v / 0.1 - round(v / 0.1)) < 1e-9 for v in values)
    assert min(values) >= 0.0 and max(values) <= 0.5 + 1e-12
    assert len(set(values)) == 6


def test_qloguniform_gives_multiples_of_q_within_bounds():
    values = column({"h": {"qloguniform": [8, 512, 8]}}, "h")
    assert all(v % 8 == 0 for v in values)
    assert min(values) >= 8 and max(values) <= 512


def test_randn_has_the_given_mean_and_std():
    values = column({"x": {"randn": [2.0, 0.5]}}, "x")
    assert np.mean(values) == pytest.approx(2.0, abs=0.05)
    assert np.std(values) == pytest.approx(0.5, abs=0.05)


def test_grid_axes_are_enumerated_in_order_and_cycled():
    space = {"a": {"grid": [1, 2]}, "b": {"grid": ["x", "y"]}, "c": 7}
    configs = sample_configs(space, 5, seed=0)
    assert [(c["a"], c["b"], c["c"]) for c in configs] == [(1, "x", 7), (1, "y", 7), (2, "x", 7), (2, "y", 7), (1, "x", 7)]
    assert sample_configs(space, 5, seed=99) == configs


def test_constants_pass_through():
    assert sample_configs({"epochs": 3, "name": "mlp", "sizes": {"grid": [[1, 2]]}}, 2) == [
        {"sizes": [1, 2], "epochs": 3, "name": "mlp"}, {"sizes": [1, 2], "epochs": 3, "name": "mlp"}]


class FakeDomain:
    """Duck-typed Ray Tune domain: ``sample(random_state=...)``, as ``tune.uniform`` has."""

    def __init__(self, low: float, high: float, as_list: bool = False):
        self.low, self.high, self.as_list = low, high, as_list
        self.states: list = []

    def sample(self, random_state=None):
        self.states.append(random_state)
        value = random_state.uniform(self.low, self.high)       # a numpy float, as Ray returns
        return [value] if self.as_list else np.float64(value)


@pytest.mark.parametrize("as_list", [False, True])
def test_a_ray_tune_like_domain_samples_from_the_seeded_generator(as_list):
    domain = FakeDomain(2.0, 3.0, as_list)
    configs = sample_configs({"x": domain}, 4, seed=5)
    assert all(isinstance(s, np.random.Generator) for s in domain.states)
    assert all(type(c["x"]) is float and 2.0 <= c["x"] <= 3.0 for c in configs)
    assert sample_configs({"x": FakeDomain(2.0, 3.0, as_list)}, 4, seed=5) == configs
    assert sample_configs({"x": FakeDomain(2.0, 3.0, as_list)}, 4, seed=6) != configs


@pytest.mark.parametrize("num", [0, -1])
def test_fewer_than_one_config_is_a_spec_error(num):
    with pytest.raises(SpecError, match="at least one trial"):
        sample_configs(SPACE, num)


def test_an_unknown_sampler_is_a_spec_error():
    with pytest.raises(SpecError, match=r"search_space\.lr: unknown sampler 'logunifrom'"):
        sample_configs({"lr": {"logunifrom": [1e-4, 1e-1]}}, 1)


def test_a_mapping_with_two_samplers_is_a_spec_error():
    with pytest.raises(SpecError, match=r"search_space\.lr: expected one sampler"):
        sample_configs({"lr": {"uniform": [0, 1], "choice": [1]}}, 1)


def test_sampling_does_not_touch_the_global_numpy_state():
    before = np.random.get_state()
    sample_configs(SPACE, 10, seed=1)
    after = np.random.get_state()
    assert (after[1] == before[1]).all() and after[2] == before[2]
