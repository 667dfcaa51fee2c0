"""`rubberband validate` on a job with `surrogate:`: the widths, what does not transfer, the
trainer's width keys checked against the search space."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.unit.cli.helpers import assert_one_line_error, run

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "experiments" / "demo_surrogate.yaml"


def _job(tmp_path: Path, **changes) -> str:
    data = yaml.safe_load(DEMO.read_text())
    for key in ("model_profile",):
        data[key] = str((DEMO.parent / data[key]).resolve())
    data["cloud"]["profile"] = str((DEMO.parent / data["cloud"]["profile"]).resolve())
    if (data.get("surrogate") or {}).get("model_profile"):     # the surrogate's own profile, beside the demo's
        data["surrogate"]["model_profile"] = str((DEMO.parent / data["surrogate"]["model_profile"]).resolve())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_the_demo_names_what_does_not_transfer(capsys):
    code, out, err = run(capsys, "validate", str(DEMO))
    assert code == 0 and err == ""
    assert "surrogate      μP, width / 8 (hidden 128 -> 16); transfers lr, momentum" in out
    assert "not transferred: hidden, weight_decay" in out


def test_json_carries_the_widths(capsys):
    import json

    code, out, _ = run(capsys, "validate", str(DEMO), "--json")
    sur = json.loads(out)["surrogate"]
    assert sur["widths"] == {"hidden": {"full": 128, "surrogate": 16}}
    assert sur["not_transferred"] == ["hidden", "weight_decay"]


def test_weight_decay_listed_as_transferring_draws_a_warning(tmp_path, capsys):
    path = _job(tmp_path, surrogate={"width_ratio": 8, "transfer": ["lr", "momentum", "weight_decay"]})
    code, out, err = run(capsys, "validate", path)
    assert code == 0
    assert "warning: surrogate.transfer: μP does not transfer weight_decay" in err
    assert "not transferred: hidden" in out


@pytest.mark.parametrize("search_space, surrogate, needles", [
    ({"lr": [0.1]}, None, ("surrogate: width key 'hidden' is not in the trial's config",)),
    ({"hidden": 100, "lr": [0.1]}, None, ("width key hidden = 100 is not divisible by width_ratio 8",)),
    ({"hidden": [64, 128], "lr": [0.1]}, None, ("search_space.hidden: a width key of the trainer must be one value",)),
    ({"hidden": 128, "lr": [0.1]}, {"width_ratio": 8, "transfer": ["lr", "hidden"]},
     ("surrogate.transfer: hidden is a width key",)),
])
def test_width_keys_are_checked_against_the_search_space(tmp_path, capsys, search_space, surrogate, needles):
    changes = {"search_space": search_space, "surrogate": surrogate or {"width_ratio": 8, "transfer": ["lr"]}}
    code, _, err = run(capsys, "validate", _job(tmp_path, **changes))
    assert code == 2
    assert_one_line_error(err, *needles)


def test_a_trainer_without_width_keys_cannot_have_a_surrogate(tmp_path, capsys):
    trainer = tmp_path / "narrowless.py"
    trainer.write_text("from rubberband.examples.digits import DigitsMLP\n\n"
                       "class Fixed(DigitsMLP):\n    width_keys = ()\n")
    code, _, err = run(capsys, "validate", _job(tmp_path, trainer=f"{trainer}:Fixed"))
    assert code == 2
    assert_one_line_error(err, "surrogate: trainer Fixed names no width_keys")
