"""`surrogate:` in an experiment: the ratio, the hyperparameters that transfer, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from rubberband.config import experiment_from_dict
from rubberband.errors import SpecError
from rubberband.spec.experiment import Surrogate

ROOT = Path(__file__).resolve().parents[3]
SPACE = {"hidden": 128, "lr": {"loguniform": [0.005, 0.5]}, "momentum": [0.5, 0.9], "weight_decay": [0.0, 1e-4],
         "dropout": [0.0, 0.1]}


def _experiment(surrogate) -> dict:
    return {
        "sha": {"num_trials": 16, "min_iters": 2, "max_iters": 40, "eta": 2},
        "model_profile": str(ROOT / "profiles" / "demo_digits_local.yaml"),
        "cloud": {"profile": str(ROOT / "cloud_profiles" / "local" / "local.yaml"), "instance_type": "local.2gpu"},
        "search_space": SPACE,
        "surrogate": surrogate,
    }


def test_a_surrogate_names_what_does_not_transfer():
    sur = Surrogate.from_dict({"width_ratio": 4, "transfer": ["lr", "momentum"]}, SPACE)
    assert sur == Surrogate(4, ("lr", "momentum"))
    assert sur.not_transferred(SPACE) == ("hidden", "weight_decay", "dropout")
    assert sur.not_transferred(SPACE, width_keys=("hidden",)) == ("hidden", "weight_decay", "dropout")
    assert Surrogate(8, ("lr", "hidden")).not_transferred(SPACE, width_keys=("hidden",))[0] == "hidden"
    assert sur.doubtful() == ()
    assert Surrogate(8, ("lr", "weight_decay", "dropout")).doubtful() == ("weight_decay", "dropout")


def test_the_ratio_defaults_to_hydros_eight():
    assert Surrogate.from_dict({"transfer": ["lr"]}, SPACE).width_ratio == 8


def test_an_experiment_file_carries_it():
    exp = experiment_from_dict(_experiment({"width_ratio": 8, "transfer": ["lr"]}), base=ROOT)
    assert exp.surrogate == Surrogate(8, ("lr",))
    assert experiment_from_dict({k: v for k, v in _experiment(None).items() if k != "surrogate"},
                                base=ROOT).surrogate is None


@pytest.mark.parametrize("surrogate, message", [
    ({"width_ratio": 1, "transfer": ["lr"]}, r"surrogate.width_ratio: expected an integer of at least 2"),
    ({"width_ratio": 2.5, "transfer": ["lr"]}, r"surrogate.width_ratio: expected an integer of at least 2"),
    ({"width_ratio": True, "transfer": ["lr"]}, r"surrogate.width_ratio: expected an integer of at least 2"),
    ({"width_ratio": 8}, r"surrogate.transfer: missing required field"),
    ({"transfer": "lr"}, r"surrogate.transfer: expected a list of search_space keys"),
    ({"transfer": ["lrr"]}, r"surrogate.transfer: 'lrr' is not a key of search_space \(did you mean `lr`\?\)"),
    ({"transfer": ["lr", "lr"]}, r"surrogate.transfer: lr listed twice"),
    ({"transfer": ["lr"], "ratio": 8}, r"surrogate.ratio: unknown key"),
    ([8], r"surrogate: expected a mapping"),
])
def test_bad_surrogates_fail_with_one_line_naming_the_field(surrogate, message):
    data = _experiment(surrogate)
    with pytest.raises(SpecError, match=message):
        experiment_from_dict(data, base=ROOT)
