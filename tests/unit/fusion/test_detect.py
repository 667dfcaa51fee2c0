"""why_not_fusable names each reason in one line; group_by_shape splits configs by shape."""

from __future__ import annotations

import pytest

from tests.unit.fusion.toys import Toy, ToyBranchy, ToyConfigData, ToyLSTM

pytest.importorskip("torch")

from rubberband.fusion import group_by_shape, why_not_fusable  # noqa: E402


def test_fusable_trials_have_no_reason():
    assert why_not_fusable(Toy(), [{"lr": 0.1}, {"lr": 0.01, "momentum": 0.9}]) is None
    assert why_not_fusable(Toy(), [{"opt": "rmsprop"}, {"opt": "rmsprop", "lr": 0.1}]) is None    # per-member step
    assert why_not_fusable(Toy(), [{"bn": True, "dropout": 0.2}] * 2) is None


def test_configs_that_change_shapes_are_grouped_and_named():
    configs = [{"hidden": 8, "lr": 0.1}, {"hidden": 16, "lr": 0.1}, {"hidden": 8, "lr": 0.2}, {"hidden": 8, "dropout": 0.5}]
    assert group_by_shape(Toy(), configs) == [[0, 2], [1], [3]]
    reason = why_not_fusable(Toy(), configs)
    assert reason is not None and "3 different model shapes" in reason and "hidden" in reason and "\n" not in reason
    assert why_not_fusable(Toy(), [configs[0], configs[2]]) is None


def test_data_dependent_control_flow_is_named():
    reason = why_not_fusable(ToyBranchy(), [{}, {}])
    assert reason is not None and reason.startswith("data-dependent control flow")


def test_an_unsupported_module_is_named():
    reason = why_not_fusable(ToyLSTM(), [{}, {}])
    assert reason is not None and reason.startswith("unsupported module (in nn.LSTM)") and "aten::lstm" in reason


def test_an_optimizer_with_a_closure_is_named():
    reason = why_not_fusable(Toy(), [{"opt": "lbfgs"}] * 2)
    assert reason is not None and "LBFGS" in reason and "closure" in reason


def test_config_dependent_data_is_named_unless_the_configs_are_equal():
    reason = why_not_fusable(ToyConfigData(), [{"lr": 0.1}, {"lr": 0.2}])
    assert reason is not None and "data_depends_on_config" in reason
    assert why_not_fusable(ToyConfigData(), [{"lr": 0.1}] * 2) is None


def test_a_function_trainable_cannot_fuse():
    def train_fn(config):
        pass

    reason = why_not_fusable(train_fn, [{}, {}])
    assert reason is not None and reason.startswith("a function trainable")


def test_the_probe_leaves_the_global_rng_alone():
    import torch

    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    why_not_fusable(Toy(), [{"dropout": 0.5}] * 2)
    assert torch.equal(torch.rand(3), expected)
