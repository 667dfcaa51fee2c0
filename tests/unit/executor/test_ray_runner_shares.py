"""The Ray runner's warm pool by GPU and share, without a Ray cluster: ``ray``, placement
groups and the worker actor class are replaced by in-process fakes that hold each instance's
GPUs like Ray would (a group holds one whole GPU; a worker takes ``num_gpus`` of its group's
GPU) and record every actor and group created, killed and removed, so the tests can check
that no GPU is oversubscribed and that nothing is leaked."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rubberband.errors import ProviderError
from rubberband.executor import ray_runner
from rubberband.executor.ports import Node
from rubberband.executor.ray_runner import RayTrialRunner

I1, I2 = "rb-instance-1", "rb-instance-2"
EPS = 1e-9


class Ref:
    """A call resolved when ``ray.get`` reads it (so a failure surfaces there, as in Ray)."""

    def __init__(self, fn):
        self.fn = fn


class FakePG:
    def __init__(self, cluster: FakeCluster, bundles: list[dict], strategy: str):
        (bundle,) = bundles
        assert bundle["GPU"] == 1 and strategy == "STRICT_PACK"
        (self.instance,) = [k for k in bundle if k != "GPU"]
        self.cluster, self.placed, self.removed = cluster, False, False

    def ready(self) -> Ref:
        def place():
            held = sum(1 for p in self.cluster.pgs if p.instance == self.instance and p.placed and not p.removed)
            if self.removed or held >= self.cluster.gpus[self.instance]:
                raise TimeoutError(f"placement group on {self.instance} pending")
            self.placed = True
        return Ref(place)

    def actors(self) -> list[FakeActor]:
        return [a for a in self.cluster.actors if a.pg is self and not a.killed]


class FakeActor:
    """A worker: every method answers at once, unless the actor is dead or could not be placed."""

    def __init__(self, cluster: FakeCluster, num_gpus: float, pg: FakePG):
        self.cluster, self.num_gpus, self.pg = cluster, num_gpus, pg
        self.killed, self.fail = False, set()
        self.calls: list[tuple] = []
        # Ray would leave an actor that does not fit its group's GPU pending forever.
        self.placed = pg.placed and not pg.removed and sum(a.num_gpus for a in pg.actors()) + num_gpus <= 1 + EPS

    def __getattr__(self, name: str):
        def remote(*args):
            def call():
                if self.killed or not self.placed or name in self.fail:
                    raise TimeoutError(f"actor {name}: unreachable")
                self.calls.append((name, *args))
                return 23456 if name == "free_port" else None
            return Ref(call)
        return SimpleNamespace(remote=remote)


class FakeActorClass:
    def __init__(self, cluster: FakeCluster, opts: dict):
        self.cluster, self.opts = cluster, opts

    def options(self, num_gpus: float, scheduling_strategy) -> FakeActorClass:
        return FakeActorClass(self.cluster, {**self.opts, "num_gpus": num_gpus, "strategy": scheduling_strategy})

    def remote(self, trainer, seed, time_attr=None) -> FakeActor:
        strategy = self.opts["strategy"]
        assert strategy.bundle_index == 0
        actor = FakeActor(self.cluster, self.opts["num_gpus"], strategy.pg)
        self.cluster.actors.append(actor)
        return actor


class FakeCluster:
    """``ray`` and its placement-group functions over instances with ``gpus`` GPUs each."""

    def __init__(self, gpus: dict[str, int]):
        self.gpus = gpus
        self.pgs: list[FakePG] = []
        self.actors: list[FakeActor] = []

    # the `ray` module
    def remote(self, **opts):
        return lambda cls: FakeActorClass(self, opts)

    def get(self, refs, timeout=None):
        return [r.fn() for r in refs] if isinstance(refs, list) else refs.fn()

    def put(self, value):
        return value

    def kill(self, actor: FakeActor, no_restart: bool = True) -> None:
        actor.killed = True

    # ray.util's placement groups and scheduling strategy
    def placement_group(self, bundles, strategy):
        pg = FakePG(self, bundles, strategy)
        self.pgs.append(pg)
        return pg

    def remove_placement_group(self, pg: FakePG) -> None:
        pg.removed = True
        for a in pg.actors():      # Ray kills the actors of a removed group
            a.killed = True

    def strategy(self, pg, placement_group_bundle_index):
        return SimpleNamespace(pg=pg, bundle_index=placement_group_bundle_index)

    # views
    def live_pgs(self) -> list[FakePG]:
        return [p for p in self.pgs if not p.removed]

    def live_actors(self) -> list[FakeActor]:
        return [a for a in self.actors if not a.killed]

    def warmed(self) -> list[FakeActor]:
        return [a for a in self.actors if any(c[0] == "warmup" for c in a.calls)]

    def check(self, most: int | None = None) -> None:
        """No GPU oversubscribed: every live actor placed in a live group, at most one
        whole GPU (and at most ``most`` workers) per group, at most ``gpus`` groups per instance."""
        for a in self.live_actors():
            assert a.placed and not a.pg.removed, "a live worker outside a live placement group"
        for p in self.live_pgs():
            assert p.placed
            assert sum(a.num_gpus for a in p.actors()) <= 1 + EPS
            if most is not None:
                assert len(p.actors()) <= most
        for inst, n in self.gpus.items():
            assert sum(1 for p in self.live_pgs() if p.instance == inst) <= n


@pytest.fixture
def cluster(monkeypatch):
    fake = FakeCluster({I1: 2, I2: 2})
    monkeypatch.setattr(ray_runner, "ray", fake)
    monkeypatch.setattr(ray_runner, "placement_group", fake.placement_group)
    monkeypatch.setattr(ray_runner, "remove_placement_group", fake.remove_placement_group)
    monkeypatch.setattr(ray_runner, "PlacementGroupSchedulingStrategy", fake.strategy)
    return fake


@pytest.fixture
def runner(cluster):
    return RayTrialRunner(trainer="tiny:Trainer", timeout_s=1.0)


NODE = Node(I1, 2)


def layout(runner: RayTrialRunner, instance: str = I1) -> list[tuple[int, int]]:
    """(share, workers) of each GPU the runner holds on ``instance``."""
    return [(g.share, len(g.workers)) for g in runner.gpus.get(instance, [])]


def nothing_left(cluster: FakeCluster, runner: RayTrialRunner) -> None:
    assert cluster.live_actors() == [] and cluster.live_pgs() == []
    assert runner.gpus == {} and runner.busy == set()


def test_warming_for_a_packing_starts_k_workers_of_one_kth_of_a_gpu_on_each_gpu(cluster, runner):
    runner.warm([NODE], trials_per_gpu=4)
    assert layout(runner) == [(4, 4), (4, 4)]
    assert len(cluster.live_pgs()) == 2 and len({a.pg for a in cluster.live_actors()}) == 2
    assert {a.num_gpus for a in cluster.actors} == {0.25}
    assert len(cluster.warmed()) == 8                      # all warmed up before the stage
    cluster.check(most=4)


def test_k4_to_2_kills_the_surplus_idle_workers_and_keeps_each_gpus_group(cluster, runner):
    runner.warm([NODE], trials_per_gpu=4)
    pgs, actors = list(cluster.live_pgs()), list(cluster.actors)
    runner.warm([NODE], trials_per_gpu=2)
    assert cluster.live_pgs() == pgs and len(cluster.pgs) == 2     # no group removed or added
    assert cluster.actors == actors                                 # no worker started
    assert layout(runner) == [(4, 2), (4, 2)]
    assert len(cluster.live_actors()) == 4
    for gpu in runner.gpus[I1]:
        assert [w.actor for w in gpu.workers] == gpu.pg.actors()   # the kept ones are the live ones
    # The stage packs 2 to a GPU, however fine its workers are.
    gangs = [runner.start(f"t{i}", {}, [I1], None, trials_per_gpu=2, gpus=[i % 2]) for i in range(4)]
    assert cluster.actors == actors and {a for g in gangs for a in g.actors} == set(cluster.live_actors())
    with pytest.raises(ProviderError, match="instance rb-instance-1: its GPU 0 already runs 2 trials"):
        runner.start("t4", {}, [I1], None, trials_per_gpu=2, gpus=[0])
    cluster.check(most=2)


def test_k4_to_2_never_kills_a_busy_worker(cluster, runner):
    runner.warm([NODE], trials_per_gpu=4)
    gangs = [runner.start(f"t{i}", {}, [I1], None, trials_per_gpu=4, gpus=[0]) for i in range(3)]
    runner.warm([NODE], trials_per_gpu=2)
    slot0 = gangs[0].workers[0].gpu
    assert all(g.workers[0].gpu is slot0 for g in gangs)
    assert len(slot0.workers) == 3                        # its 3 busy workers, no idle one
    assert all(not a.killed for g in gangs for a in g.actors)
    assert layout(runner) == [(4, 3), (4, 2)]
    cluster.check()


def test_k2_to_4_replaces_idle_coarse_gpus_and_never_puts_more_than_k_on_one(cluster, runner):
    runner.warm([NODE], trials_per_gpu=2)
    old_pgs, old_actors = list(cluster.pgs), list(cluster.actors)
    runner.warm([NODE], trials_per_gpu=4)
    assert all(p.removed for p in old_pgs) and all(a.killed for a in old_actors)
    assert layout(runner) == [(4, 4), (4, 4)]
    assert len(cluster.live_pgs()) == 2 and {a.num_gpus for a in cluster.live_actors()} == {0.25}
    assert set(cluster.warmed()) >= set(cluster.live_actors())
    cluster.check(most=4)


def test_k2_to_4_keeps_a_busy_coarse_gpu_and_replaces_it_once_it_is_idle(cluster, runner):
    runner.warm([NODE], trials_per_gpu=2)
    gang = runner.start("t0", {}, [I1], None, trials_per_gpu=2, gpus=[0])
    busy_gpu = gang.workers[0].gpu
    runner.warm([NODE], trials_per_gpu=4)
    assert busy_gpu in runner.gpus[I1] and not busy_gpu.pg.removed and not gang.actors[0].killed
    assert sorted(layout(runner)) == [(2, 2), (4, 4)]      # left as it is while busy
    cluster.check()
    fine = [runner.start(f"u{i}", {}, [I1], None, trials_per_gpu=4, gpus=[1]) for i in range(4)]
    assert all(g.workers[0].gpu.share == 4 for g in fine)
    with pytest.raises(ProviderError, match="no free GPU for a worker"):
        runner.start("u4", {}, [I1], None, trials_per_gpu=4, gpus=[0])   # the coarse GPU is busy
    runner.stop(gang)
    late = runner.start("u4", {}, [I1], None, trials_per_gpu=4, gpus=[0])
    assert busy_gpu.pg.removed and gang.actors[0].killed  # the idle coarse GPU made room
    assert late.workers[0].gpu.share == 4 and late.workers[0].gpu.slot == 0
    assert ("warmup",) in late.actors[0].calls
    cluster.check(most=4)


def test_packed_to_unpacked_and_back_reuses_each_gpus_group(cluster, runner):
    runner.warm([NODE], trials_per_gpu=2)
    pgs = list(cluster.pgs)
    runner.warm([NODE], trials_per_gpu=1)
    assert layout(runner) == [(2, 1), (2, 1)] and cluster.live_pgs() == pgs
    whole = [runner.start(f"t{i}", {}, [I1], None) for i in range(2)]
    assert {g.workers[0].gpu.pg for g in whole} == set(pgs)        # one trial per GPU
    with pytest.raises(ProviderError, match="no free GPU for a worker"):
        runner.start("t2", {}, [I1], None)
    assert len(cluster.pgs) == 3 and cluster.live_pgs() == pgs      # the group it tried is gone
    for g in whole:
        runner.stop(g)
    runner.warm([NODE], trials_per_gpu=2)
    assert layout(runner) == [(2, 2), (2, 2)] and cluster.live_pgs() == pgs and len(cluster.pgs) == 3
    assert len(cluster.actors) == 6 and set(cluster.warmed()) == set(cluster.actors)
    cluster.check(most=2)


def test_unpacked_to_packed_and_back_swaps_whole_gpu_workers(cluster, runner):
    runner.warm([NODE], trials_per_gpu=1)
    assert layout(runner) == [(1, 1), (1, 1)] and {a.num_gpus for a in cluster.actors} == {1}
    runner.warm([NODE], trials_per_gpu=2)
    assert layout(runner) == [(2, 2), (2, 2)] and len(cluster.live_pgs()) == 2 and len(cluster.pgs) == 4
    assert {a.num_gpus for a in cluster.live_actors()} == {0.5}
    runner.warm([NODE], trials_per_gpu=1)
    assert layout(runner) == [(2, 1), (2, 1)] and len(cluster.pgs) == 4
    cluster.check(most=2)


def test_a_packed_trial_goes_only_to_its_own_slots_gpu_and_share(cluster, runner):
    runner.warm([Node(I1, 2), Node(I2, 2)], trials_per_gpu=2)
    a = runner.start("a", {}, [I1], None, trials_per_gpu=2, gpus=[1])
    b = runner.start("b", {}, [I1], None, trials_per_gpu=2, gpus=[0])
    c = runner.start("c", {}, [I1], None, trials_per_gpu=2, gpus=[1])
    gpu1, gpu0 = a.workers[0].gpu, b.workers[0].gpu
    assert gpu1 is not gpu0 and (gpu1.slot, gpu0.slot) == (1, 0)
    assert c.workers[0].gpu is gpu1                          # beside a, on slot 1's GPU
    d = runner.start("d", {}, [I1], None, trials_per_gpu=2, gpus=[0])
    assert d.workers[0].gpu is gpu0
    runner.stop(a)                                           # slot 1's GPU has an idle worker again
    with pytest.raises(ProviderError, match="its GPU 0 already runs 2 trials"):
        runner.start("e", {}, [I1], None, trials_per_gpu=2, gpus=[0])
    assert not a.actors[0].killed and a.workers[0] not in runner.busy
    e = runner.start("e", {}, [I1], None, trials_per_gpu=2, gpus=[1])
    assert e.actors == a.actors                              # the freed worker, on its own slot
    # A gang over two instances: one worker on each slot's GPU, ranks joined in order.
    runner.stop(b)
    f = runner.start("f", {"lr": 0.1}, [I2, I1], b"ckpt", trials_per_gpu=2, gpus=[1, 0])
    assert f.workers[1].gpu is gpu0 and f.workers[0].gpu.instance == I2 and f.workers[0].gpu.slot == 1
    assert [c for c in f.actors[0].calls if c[0] == "join"] == [("join", 0, 2, 23456)]
    assert [c for c in f.actors[1].calls if c[0] == "join"] == [("join", 1, 2, 23456)]
    assert all(("assign", {"lr": 0.1}, b"ckpt", "f") in w.calls for w in f.actors)
    # A finer share never lands on these half-GPU workers, nor a coarser one beside them.
    with pytest.raises(ProviderError, match="no free GPU for a worker"):
        runner.start("g", {}, [I1], None, trials_per_gpu=4, gpus=[1])
    assert len(cluster.live_pgs()) == 4
    cluster.check(most=2)


def test_a_slot_without_a_gpu_yet_takes_a_free_one_not_another_slots(cluster, runner):
    runner.warm([NODE], trials_per_gpu=2)
    a = runner.start("a", {}, [I1], None, trials_per_gpu=2, gpus=[1])
    runner.stop(a)                                   # slot 1's GPU is idle, and still slot 1's
    b = runner.start("b", {}, [I1], None, trials_per_gpu=2, gpus=[0])
    c = runner.start("c", {}, [I1], None, trials_per_gpu=2, gpus=[1])
    assert b.workers[0].gpu is not a.workers[0].gpu and b.workers[0].gpu.slot == 0
    assert c.workers[0].gpu is a.workers[0].gpu and a.workers[0].gpu.slot == 1
    cluster.check(most=2)


def test_a_dead_gang_is_replaced_and_its_gpu_freed_with_its_last_worker(cluster, runner):
    runner.warm([NODE], trials_per_gpu=2)
    a = runner.start("a", {}, [I1], None, trials_per_gpu=2, gpus=[0])
    b = runner.start("b", {}, [I1], None, trials_per_gpu=2, gpus=[0])
    gpu = a.workers[0].gpu
    a.actors[0].fail.add("leave")
    runner.stop(a)
    assert a.actors[0].killed and not b.actors[0].killed and not gpu.pg.removed
    assert gpu.workers == b.workers and runner.busy == set(b.workers)
    b.actors[0].fail.add("leave")
    runner.stop(b)
    assert gpu.pg.removed and gpu not in runner.gpus[I1] and runner.busy == set()
    cluster.check()


def test_a_failed_start_kills_the_workers_it_took_and_leaks_no_group(cluster, runner):
    runner.warm([Node(I1, 2)], trials_per_gpu=1)
    cluster.gpus[I2] = 0
    with pytest.raises(ProviderError, match="instance rb-instance-2: no free GPU for a worker"):
        runner.start("a", {}, [I1, "rb-instance-2"], None, gpus=[0, 0])  # I2 has no GPU free
    assert len(cluster.live_actors()) == 1 and runner.busy == set()
    assert len(cluster.live_pgs()) == 1 and all(p.instance == I1 for p in cluster.live_pgs())
    cluster.check()


@pytest.mark.parametrize("k", [1, 2, 4])
def test_release_forget_and_shutdown_remove_every_actor_and_group(cluster, runner, k):
    nodes = [Node(I1, 2), Node(I2, 2)]
    runner.warm(nodes, trials_per_gpu=k)
    busy = runner.start("a", {}, [I1, I2], None, trials_per_gpu=k, gpus=[0, 1] if k > 1 else None)
    assert not any(a.killed for a in busy.actors)
    runner.release_instance(I2)
    assert all(a.killed for a in cluster.actors if a.pg.instance == I2)
    assert all(p.removed for p in cluster.pgs if p.instance == I2)
    assert I2 not in runner.gpus and not any(w.instance == I2 for w in runner.busy)
    assert layout(runner) == [(k, k), (k, k)]
    runner.forget_dead([I2])                                 # I1 is gone
    nothing_left(cluster, runner)
    runner.warm(nodes, trials_per_gpu=k)
    runner.start("b", {}, [I1], None, trials_per_gpu=k, gpus=[0] if k > 1 else None)
    runner.forget_dead([I1, I2])                             # both alive: nothing dropped
    assert len(cluster.live_pgs()) == 4 and len(cluster.live_actors()) == 4 * k
    runner.shutdown()
    nothing_left(cluster, runner)


def test_a_group_that_cannot_be_removed_still_loses_its_workers(cluster, runner, monkeypatch):
    runner.warm([NODE], trials_per_gpu=2)

    def unreachable(pg):
        raise ConnectionError("GCS unreachable")

    monkeypatch.setattr(ray_runner, "remove_placement_group", unreachable)
    runner.shutdown()
    assert cluster.live_actors() == [] and runner.gpus == {}     # the workers do not wait on the group


@pytest.mark.parametrize(("trainer", "restarts"), [
    ("rubberband.examples.tune_function:train_digits", True),        # named, as `rubberband run` passes it
    ("rubberband.examples.digits:DigitsMLP", False),
])
def test_a_function_trainables_runner_restarts_it_at_every_stage(cluster, trainer, restarts):
    pytest.importorskip("torch")
    assert RayTrialRunner(trainer=trainer, timeout_s=1.0).restarts_each_stage is restarts
