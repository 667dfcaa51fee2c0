"""Function trainables without Ray or torch: a session pauses the function at the report that
completes a chunk, keeps its latest checkpoint, and resumes it (redoing what came after that
checkpoint); errors and early returns are one clear error; a stop unwinds the function."""

import os
import tempfile
import threading

import pytest

import rubberband as rb
from rubberband import function_api as fa


def counter(checkpoint_every: int | None = 1, log: list | None = None):
    """A Ray-Tune-style function: its own counter, restored from its checkpoint's file."""

    def fn(config):
        i = 0
        ckpt = rb.get_checkpoint()
        if ckpt is not None:
            with ckpt.as_directory() as d:
                i = int(open(os.path.join(d, "i")).read())
        while True:
            i += 1
            if log is not None:
                log.append(i)
            if checkpoint_every and i % checkpoint_every == 0:
                with tempfile.TemporaryDirectory() as d:       # gone once report returns: it must be copied
                    with open(os.path.join(d, "i"), "w") as fh:
                        fh.write(str(i))
                    rb.report({"i": i, "lr": config["lr"]}, checkpoint=rb.Checkpoint.from_directory(d))
            else:
                rb.report({"i": i, "lr": config["lr"]})

    return fn


def resume(session: fa.FunctionSession, fn) -> fa.FunctionSession:
    """The trial resumed elsewhere: from its packed state, as a fresh worker gets it."""
    blob = fa.pack_state(session.state())
    session.stop()
    return fa.FunctionSession(fn, session.config, fa.TrialContext("t001"), fa.unpack_state(blob))


def test_a_chunk_pauses_the_function_at_its_last_report():
    log: list[int] = []
    s = fa.FunctionSession(counter(log=log), {"lr": 0.1})
    redone, counted = s.advance(3)
    assert redone == [] and [r.iteration for r in counted] == [1, 2, 3]
    assert [r.metrics["i"] for r in counted] == [1, 2, 3] and counted[-1].metrics["lr"] == 0.1
    assert counted[-1].metrics["training_iteration"] == 3
    assert log == [1, 2, 3], "paused inside report 3: nothing runs past it"
    _, counted = s.advance(2)
    assert [r.metrics["i"] for r in counted] == [4, 5] and all(r.seconds >= 0 for r in counted)
    s.stop()
    assert not s.alive


def test_a_trial_resumes_from_its_latest_checkpoint_with_its_counter_going_on():
    fn = counter(checkpoint_every=1)
    s = fa.FunctionSession(fn, {"lr": 0.1})
    s.advance(4)
    s = resume(s, fn)
    redone, counted = s.advance(2)
    assert redone == [] and [r.metrics["i"] for r in counted] == [5, 6]
    assert s.state() == fa.TrialState(s.state().files, 6, 6, 6, (1, 2, 3, 4, 5, 6),
                                      {"i": 6, "lr": 0.1, "training_iteration": 6})
    s.stop()


def test_a_checkpoint_older_than_the_count_means_redoing_the_iterations_since():
    fn = counter(checkpoint_every=3)
    s = fa.FunctionSession(fn, {"lr": 0.1})
    s.advance(5)
    assert (s.state().checkpoint_iteration, s.state().counted, s.state().behind) == (3, 5, 2)
    s = resume(s, fn)
    redone, counted = s.advance(2)
    assert [r.metrics["i"] for r in redone] == [4, 5]
    assert [r.metrics["i"] for r in counted] == [6, 7] and [r.iteration for r in counted] == [6, 7]
    s.stop()


def test_a_function_that_never_checkpoints_restarts_from_scratch():
    fn = counter(checkpoint_every=None)
    s = fa.FunctionSession(fn, {"lr": 0.1})
    s.advance(2)
    assert s.state().files is None
    s = resume(s, fn)
    redone, counted = s.advance(1)
    assert [r.metrics["i"] for r in redone] == [1, 2] and [r.metrics["i"] for r in counted] == [3]
    s.stop()


def test_only_the_checkpointing_rank_keeps_its_checkpoints():
    s = fa.FunctionSession(counter(), {"lr": 0.1}, fa.TrialContext("t", world_size=2, world_rank=1))
    s.advance(2)
    assert s.state().files is None
    s.stop()


def test_stopping_unwinds_a_function_that_catches_exceptions():
    cleaned = threading.Event()

    def stubborn(config):
        try:
            while True:
                try:
                    rb.report({"x": 1.0})
                except Exception:        # a broad except must not swallow the stop
                    pass
        finally:
            cleaned.set()

    s = fa.FunctionSession(stubborn, {})
    s.advance(1)
    s.stop()
    assert cleaned.is_set() and not s.alive


def test_a_function_that_raises_is_one_error_with_its_traceback():
    def broken(config):
        rb.report({"x": 1.0})
        raise ValueError("bad batch")

    s = fa.FunctionSession(broken, {}, fa.TrialContext("t007"))
    s.advance(1)
    with pytest.raises(fa.TrialFunctionError, match="trial t007: the trial function raised ValueError: bad batch") as err:
        s.advance(1)
    assert "raise ValueError" in err.value.traceback_text


def test_a_function_that_returns_too_early_says_to_keep_reporting():
    def short(config):
        for i in range(2):
            rb.report({"i": i})

    s = fa.FunctionSession(short, {}, fa.TrialContext("t001"))
    with pytest.raises(fa.TrialFunctionError, match="returned after 2 report.*keep calling report"):
        s.advance(3)


def test_metrics_become_plain_values():
    class Scalar:
        def item(self):
            return 0.5

    assert fa.clean_metrics({"loss": Scalar(), "name": "a", "n": 3, "obj": object()}) == {"loss": 0.5, "name": "a", "n": 3}
    with pytest.raises(TypeError, match="expected a dict"):
        fa.clean_metrics([1.0])


def test_the_context_names_the_trial_and_its_gang():
    seen = {}

    def fn(config):
        ctx = rb.get_context()
        seen.update(trial=ctx.get_trial_id(), world=ctx.get_world_size(), rank=ctx.get_world_rank(),
                    gpus=ctx.get_gpu_ids())
        rb.report({})

    s = fa.FunctionSession(fn, {}, fa.TrialContext("t003", world_size=2, world_rank=1, gpu_ids=("3",)))
    s.advance(1)
    s.stop()
    assert seen == {"trial": "t003", "world": 2, "rank": 1, "gpus": ["3"]}


def test_the_api_outside_a_trial_says_how_to_run_it():
    with pytest.raises(RuntimeError, match=r"rubberband.report\(\) is called outside a trial"):
        rb.report({"x": 1})


def test_checkpoint_directories_copy_and_round_trip(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "w.bin").write_bytes(b"abc")
    ckpt = rb.Checkpoint.from_directory(src)
    with ckpt.as_directory() as d:
        assert d == str(src)
    copy = ckpt.to_directory(tmp_path / "copy")
    assert (tmp_path / "copy" / "sub" / "w.bin").read_bytes() == b"abc" and copy == str(tmp_path / "copy")
    state = fa.unpack_state(fa.pack_state(fa.TrialState(fa._tar_directory(str(src)), 3, 5)))
    assert (state.checkpoint_iteration, state.counted) == (3, 5)
    fa._untar(state.files, str(tmp_path / "out"))
    assert (tmp_path / "out" / "sub" / "w.bin").read_bytes() == b"abc"
    with pytest.raises(ValueError, match="not a function trainable's checkpoint"):
        fa.unpack_state(b"PK\x03\x04")


def test_only_plain_callables_are_function_trainables():
    from rubberband.executor.trainer import Trainer

    assert fa.is_function_trainable(counter())
    assert not fa.is_function_trainable(Trainer) and not fa.is_function_trainable(Trainer())


def test_validate_checks_the_signature_and_warns_when_a_function_never_checkpoints(tmp_path):
    from rubberband.errors import SpecError
    from rubberband.executor.worker import load_trainer

    path = tmp_path / "fns.py"
    path.write_text("import rubberband as rb\n\n"
                    "def never(config):\n    while True:\n        rb.report({'x': 1.0})\n\n"
                    "def two(config, other):\n    pass\n")
    never, two = load_trainer(f"{path}:never"), load_trainer(f"{path}:two")
    [warning] = fa.check_function(never, "fns:never")
    assert "never passes checkpoint= to report()" in warning
    with pytest.raises(SpecError, match=r"trainer: fns:two must take one argument, the trial's config"):
        fa.check_function(two, "fns:two")
    assert fa.check_function(counter(), "this file") == []       # this file passes checkpoint=


def test_a_function_error_keeps_its_traceback_when_pickled():
    import pickle

    err = pickle.loads(pickle.dumps(fa.TrialFunctionError("trial t1: the trial function raised X", "Traceback: ...")))
    assert str(err) == "trial t1: the trial function raised X" and err.traceback_text == "Traceback: ..."


# --- time_attr: a metric counts the trial's iterations ---------------------------------------------

def by_epochs(step: float, checkpoint_every: int | None = None, log: list | None = None):
    """Reports every ``step`` epochs under ``epoch`` (a checkpoint every ``checkpoint_every`` reports)."""

    def fn(config):
        n = 0
        ckpt = rb.get_checkpoint()
        if ckpt is not None:
            with ckpt.as_directory() as d:
                n = int(open(os.path.join(d, "n")).read())
        while True:
            n += 1
            if log is not None:
                log.append(n * step)
            if checkpoint_every and n % checkpoint_every == 0:
                with tempfile.TemporaryDirectory() as d:
                    with open(os.path.join(d, "n"), "w") as fh:
                        fh.write(str(n))
                    rb.report({"epoch": n * step}, checkpoint=rb.Checkpoint.from_directory(d))
            else:
                rb.report({"epoch": n * step})

    return fn


def test_half_epoch_reports_count_by_epoch_and_stop_at_the_stages_end():
    log: list[float] = []
    s = fa.FunctionSession(by_epochs(0.5, log=log), {}, time_attr="epoch")
    _, counted = s.advance(3)
    assert [r.iteration for r in counted] == [0.5, 1, 1.5, 2, 2.5, 3]
    assert log[-1] == 3.0, "paused inside the report that reached epoch 3"
    assert len(s.iter_times(counted, 3)) == 3 and sum(s.iter_times(counted, 3)) == pytest.approx(
        sum(r.seconds for r in counted))
    _, counted = s.advance(1)
    assert [r.iteration for r in counted] == [3.5, 4]
    s.stop()


def test_a_report_past_the_target_ends_the_stage_and_does_not_move_the_next():
    s = fa.FunctionSession(by_epochs(2), {}, time_attr="epoch")
    _, counted = s.advance(3)             # the first report at or past epoch 3 is epoch 4
    assert [r.iteration for r in counted] == [2, 4]
    _, counted = s.advance(3)             # target 6 (3 + 3, not 4 + 3): epoch 6
    assert [r.iteration for r in counted] == [6]
    _, counted = s.advance(1)             # target 7: epoch 8
    assert [r.iteration for r in counted] == [8]
    assert s.advance(1) == ([], [])       # target 8: epoch 8 already reached it, nothing runs
    assert s.last_metrics()["epoch"] == 8
    assert (s.state().counted, s.state().reached) == (8, 8)
    s.stop()


def test_time_attr_redone_reports_are_those_up_to_where_the_trial_had_got():
    fn = by_epochs(2, checkpoint_every=2)             # checkpoints at epochs 4, 8, ...
    s = fa.FunctionSession(fn, {}, time_attr="epoch")
    s.advance(5)                                      # epochs 2 4 6: stops at 6, checkpoint at 4
    assert (s.state().checkpoint_iteration, s.state().counted, s.state().reached) == (4, 5, 6)
    assert s.state().checkpoints == (4,) and s.state().behind == 2
    blob = fa.pack_state(s.state())
    s.stop()
    s = fa.FunctionSession(fn, {}, state=fa.unpack_state(blob), time_attr="epoch")
    redone, counted = s.advance(5)                    # target 10: epoch 6 again, then 8 and 10
    assert [r.iteration for r in redone] == [6] and [r.iteration for r in counted] == [8, 10]
    assert s.state().checkpoints == (4, 8)
    s.stop()


def test_a_resumed_trial_whose_checkpoint_already_passed_the_target_trains_nothing():
    fn = by_epochs(4, checkpoint_every=1)             # a checkpoint at every report: epochs 4, 8, ...
    s = fa.FunctionSession(fn, {}, time_attr="epoch")
    s.advance(3)                                      # stops at epoch 4 (checkpointed): counted 3
    blob = fa.pack_state(s.state())
    s.stop()
    s = fa.FunctionSession(fn, {}, state=fa.unpack_state(blob), time_attr="epoch")
    assert s.advance(1) == ([], [])                   # target 4: its checkpoint is at epoch 4
    assert s.last_metrics() == {"epoch": 4} and not s.alive
    _, counted = s.advance(1)                         # target 5: epoch 8
    assert [r.iteration for r in counted] == [8]
    s.stop()


def test_training_iteration_as_time_attr_is_the_report_count_ray_fills_in():
    s = fa.FunctionSession(counter(), {"lr": 0.1}, time_attr="training_iteration")
    _, counted = s.advance(3)
    assert [r.iteration for r in counted] == [1, 2, 3] and counted[-1].metrics["training_iteration"] == 3
    s.stop()


@pytest.mark.parametrize(("reports", "match"), [
    ([{"loss": 1.0}], r"no number under 'epoch', the experiment's time_attr"),
    ([{"epoch": "one"}], r"no number under 'epoch'"),
    ([{"epoch": 2}, {"epoch": 1}], r"'epoch' went from 2 back to 1; .* must never decrease"),
])
def test_a_missing_or_decreasing_time_attr_is_one_error(reports, match):
    def fn(config):
        for metrics in reports:
            rb.report(metrics)

    s = fa.FunctionSession(fn, {}, time_attr="epoch")
    with pytest.raises(fa.TrialFunctionError, match=match):
        s.advance(5)
    s.stop()


def test_states_written_before_keep_loading():
    old = fa.STATE_MAGIC + b'{"checkpoint_iteration": 3, "counted": 5, "has_files": false}\n'
    assert fa.unpack_state(old) == fa.TrialState(None, 3, 5, 5, ())
