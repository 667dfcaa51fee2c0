"""ExperimentSpec: SHA and HyperBand generators, chaining, validation."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rubberband import ExperimentSpec, SpecError, Stage


def stage_list(spec: ExperimentSpec) -> list[tuple[int, int]]:
    return [spec.get_stage(i) for i in range(spec.num_stages())]


# --- SHA against hand-computed stage lists ------------------------------------------------

@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # The DESIGN example: 7 halvings down to one trial; 4+8+...+128 = 252, 508-252 = 256.
        ((64, 4, 508, 2), [(64, 4), (32, 8), (16, 16), (8, 32), (4, 64), (2, 128), (1, 256)]),
        # The paper's end-to-end job: 32 -> 10 -> 3 -> 1; 1+3+9 = 13 done, 50-13 = 37 left.
        ((32, 1, 50, 3), [(32, 1), (10, 3), (3, 9), (1, 37)]),
        # Fewer than eta trials remain: 8 // 3 = 2 < 3, so stage 1 is last and trains to 1000.
        ((8, 1, 1000, 3), [(8, 1), (2, 999)]),
        # The budget reaches max_iters: 4+8+16 = 28 done, 28+32 >= 50, so the last stage trains 22.
        ((64, 4, 50, 2), [(64, 4), (32, 8), (16, 16), (8, 22)]),
        # The budget lands exactly on max_iters: 2+4 = 6 done, 6+8 = 14, last stage trains 8.
        ((16, 2, 14, 2), [(16, 2), (8, 4), (4, 8)]),
        # min_iters == max_iters: a single stage.
        ((10, 7, 7, 2), [(10, 7)]),
        ((1, 1, 100, 2), [(1, 100)]),
        # A single trial from the start: one stage whatever the budget.
        ((1, 3, 3, 4), [(1, 3)]),
    ],
)
def test_sha_hand_computed(args, expected):
    spec = ExperimentSpec.sha(*args)
    assert stage_list(spec) == expected
    assert spec.eta == args[3]
    assert spec.bracket_starts == (0,)


def test_sha_512_has_ten_stages_ending_at_2052():
    spec = ExperimentSpec.sha(512, 4, 4096, 2)
    stages = stage_list(spec)
    assert len(stages) == 10
    assert stages[:9] == [(512 >> i, 4 << i) for i in range(9)]
    assert stages[-1] == (1, 2052)          # 4096 - 4 * (2**9 - 1)
    assert sum(k for _, k in stages) == 4096


def test_sha_default_eta_is_2():
    assert ExperimentSpec.sha(8, 1, 7) == ExperimentSpec.sha(8, 1, 7, 2)


@settings(max_examples=150, deadline=None)
@given(
    num_trials=st.integers(1, 2000),
    min_iters=st.integers(1, 64),
    extra=st.integers(0, 5000),
    eta=st.integers(2, 7),
)
def test_sha_laws(num_trials, min_iters, extra, eta):
    max_iters = min_iters + extra
    spec = ExperimentSpec.sha(num_trials, min_iters, max_iters, eta)
    stages = stage_list(spec)
    trials = [n for n, _ in stages]
    iters = [k for _, k in stages]

    # The surviving trial has trained exactly max_iters in total.
    assert sum(iters) == max_iters
    # Trial counts follow floor(n / eta), starting from num_trials.
    assert trials[0] == num_trials
    assert all(trials[i] == trials[i - 1] // eta for i in range(1, len(trials)))
    # Every stage but the last trains min_iters * eta**i and does not satisfy the stopping
    # rule; the last stage is the first that does.
    done = 0
    for i, (n, k) in enumerate(stages):
        budget = min_iters * eta**i
        stops = n == 1 or n < eta or done + budget >= max_iters
        if i < len(stages) - 1:
            assert not stops
            assert k == budget
        else:
            assert stops
            assert k == max_iters - done
            assert 1 <= k
        done += k


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"num_trials": 0, "min_iters": 1, "max_iters": 10}, "num_trials"),
        ({"num_trials": -4, "min_iters": 1, "max_iters": 10}, "num_trials"),
        ({"num_trials": 2.5, "min_iters": 1, "max_iters": 10}, "num_trials"),
        ({"num_trials": "8", "min_iters": 1, "max_iters": 10}, "num_trials"),
        ({"num_trials": True, "min_iters": 1, "max_iters": 10}, "num_trials"),
        ({"num_trials": 8, "min_iters": 0, "max_iters": 10}, "min_iters"),
        ({"num_trials": 8, "min_iters": 1, "max_iters": -10}, "max_iters"),
        ({"num_trials": 8, "min_iters": 5, "max_iters": 4}, "max_iters"),
        ({"num_trials": 8, "min_iters": 1, "max_iters": 10, "eta": 1}, "eta"),
        ({"num_trials": 8, "min_iters": 1, "max_iters": 10, "eta": 0}, "eta"),
        ({"num_trials": 8, "min_iters": 1, "max_iters": 10, "eta": 2.0}, "eta"),
    ],
)
def test_sha_rejects_bad_arguments(kwargs, field):
    with pytest.raises(SpecError, match=rf"^{field}:"):
        ExperimentSpec.sha(**kwargs)


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_sha_rejects_non_finite_trials_with_spec_error(value):
    with pytest.raises(SpecError, match="num_trials"):
        ExperimentSpec.sha(value, 1, 10)


# --- HyperBand ----------------------------------------------------------------------------

def test_hyperband_brackets_hand_computed():
    # s_max = floor(log3(81)) = 4; bracket s starts ceil(5 / (s + 1) * 3**s) trials at
    # max(1, 81 // 3**s) iterations and is an SHA with eta 3 up to 81 iterations in total.
    #   s=4: n=81, r=1  -> 81x1 27x3 9x9 3x27, then 1 trial: 81-40 = 41
    #   s=3: n=34, r=3  -> 34x3 11x9 3x27, then 1 trial: 81-39 = 42
    #   s=2: n=15, r=9  -> 15x9 5x27, then 1 trial: 81-36 = 45
    #   s=1: n=8,  r=27 -> 8x27, then 2 < eta trials: 81-27 = 54
    #   s=0: n=5,  r=81 -> 5x81
    brackets = ExperimentSpec.hyperband(min_iters=1, max_iters=81, eta=3)
    assert [stage_list(b) for b in brackets] == [
        [(81, 1), (27, 3), (9, 9), (3, 27), (1, 41)],
        [(34, 3), (11, 9), (3, 27), (1, 42)],
        [(15, 9), (5, 27), (1, 45)],
        [(8, 27), (2, 54)],
        [(5, 81)],
    ]
    assert all(b.eta == 3 for b in brackets)
    assert all(sum(b.iters) == 81 for b in brackets)


def test_hyperband_single_bracket_when_min_equals_max():
    assert [stage_list(b) for b in ExperimentSpec.hyperband(9, 9, 3)] == [[(1, 9)]]


@pytest.mark.parametrize(
    ("args", "field"),
    [((0, 81, 3), "min_iters"), ((1, 0, 3), "max_iters"), ((10, 9, 3), "max_iters"), ((1, 81, 1), "eta")],
)
def test_hyperband_rejects_bad_arguments(args, field):
    with pytest.raises(SpecError, match=rf"^{field}:"):
        ExperimentSpec.hyperband(*args)


def test_chain_and_brackets_round_trip():
    brackets = ExperimentSpec.hyperband(1, 81, 3)
    job = ExperimentSpec.chain(brackets)
    assert job.num_stages() == sum(b.num_stages() for b in brackets) == 15
    assert job.bracket_starts == (0, 5, 9, 12, 14)
    assert job.eta == 3
    # Trial counts grow at bracket starts, which a single bracket would reject.
    assert job.get_stage(5) == (34, 3)
    assert job.brackets() == brackets


def test_chain_of_mixed_etas_has_no_eta():
    job = ExperimentSpec.chain([ExperimentSpec.sha(8, 1, 8, 2), ExperimentSpec.sha(9, 1, 9, 3)])
    assert job.eta is None
    assert [stage_list(b) for b in job.brackets()] == [
        stage_list(ExperimentSpec.sha(8, 1, 8, 2)),
        stage_list(ExperimentSpec.sha(9, 1, 9, 3)),
    ]


def test_brackets_of_a_single_sha_is_itself():
    spec = ExperimentSpec.sha(64, 4, 508, 2)
    assert spec.brackets() == [spec]


def test_bracket_start_past_the_last_stage_is_rejected():
    with pytest.raises(SpecError, match="bracket_starts"):
        ExperimentSpec(((4, 1), (2, 2)), (0, 2))


# --- the builder API ----------------------------------------------------------------------

def test_add_stage_chains_and_leaves_the_original_unchanged():
    empty = ExperimentSpec()
    one = empty.add_stage(32, 1)
    three = one.add_stage(10, 3).add_stage(3, 9)
    assert empty.num_stages() == 0
    assert one.num_stages() == 1
    assert three.num_stages() == 3
    assert stage_list(three) == [(32, 1), (10, 3), (3, 9)]
    assert three.trials == (32, 10, 3)
    assert three.iters == (1, 3, 9)
    assert three.total_iters() == 32 * 1 + 10 * 3 + 3 * 9
    assert len(three) == 3
    assert three.describe() == "3 stages: 32x1 10x3 3x9"


def test_spec_is_frozen():
    spec = ExperimentSpec().add_stage(4, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.stages = ()  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.stages[0].iters = 3  # type: ignore[misc]


def test_same_stages_built_two_ways_are_equal():
    built = ExperimentSpec().add_stage(32, 1).add_stage(10, 3).add_stage(3, 9).add_stage(1, 37)
    assert built.stages == ExperimentSpec.sha(32, 1, 50, 3).stages
    assert ExperimentSpec.from_stages([(32, 1), (10, 3), (3, 9), (1, 37)]) == built


def test_integral_floats_are_accepted_as_integers():
    assert ExperimentSpec().add_stage(4.0, 2.0).stages == (Stage(4, 2),)


@pytest.mark.parametrize("index", [-1, 3, 100])
def test_get_stage_out_of_range(index):
    spec = ExperimentSpec.from_stages([(32, 1), (10, 3), (3, 9)])
    with pytest.raises(SpecError, match=r"stage index .* out of range 0\.\.2"):
        spec.get_stage(index)


@pytest.mark.parametrize(
    ("num_trials", "iters", "field"),
    [
        (0, 1, "num_trials"), (-3, 1, "num_trials"), (2.5, 1, "num_trials"), ("4", 1, "num_trials"),
        (None, 1, "num_trials"), (True, 1, "num_trials"),
        (4, 0, "iters"), (4, -1, "iters"), (4, 1.5, "iters"), (4, "10", "iters"),
    ],
)
def test_add_stage_rejects_bad_values(num_trials, iters, field):
    with pytest.raises(SpecError, match=rf"^{field}:"):
        ExperimentSpec().add_stage(num_trials, iters)


def test_trial_counts_cannot_grow_within_a_bracket():
    with pytest.raises(SpecError, match=r"stages\[1\]\.num_trials: 8 is more than the 4 trials"):
        ExperimentSpec().add_stage(4, 1).add_stage(8, 2)


def test_eta_of_one_is_rejected_on_the_spec():
    with pytest.raises(SpecError, match="eta"):
        ExperimentSpec(((4, 1),), (0,), 1)


def test_empty_spec_does_not_validate():
    with pytest.raises(SpecError, match="no stages"):
        ExperimentSpec().validate()


def test_from_stages_rejects_wrong_arity():
    with pytest.raises(SpecError, match=r"stages\[1\]: expected \[num_trials, iters\]"):
        ExperimentSpec.from_stages([(4, 1), (2, 1, 5)])
