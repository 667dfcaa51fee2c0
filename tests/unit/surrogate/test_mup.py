"""μP written out (rubberband.surrogate): rules by parameter name, the surrogate and target
trainers, what survives checkpointing, and a cross-check against the `mup` library where it
is installed (``pip install --no-deps mup``; the test skips without it)."""

from __future__ import annotations

import copy
import io

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from rubberband.errors import SpecError  # noqa: E402
from rubberband.executor.trainer import Trainer  # noqa: E402
from rubberband.surrogate import (  # noqa: E402
    Family,
    Kind,
    param_rules,
    surrogate_trainer,
    target_trainer,
    width_config,
)
from rubberband.surrogate.parametrization import module_kinds  # noqa: E402


class DeepMLP(Trainer):
    """64 -> W -> W -> 10: input, hidden and output weights (the issue's measured shape)."""

    width_keys = ("width",)

    def __init__(self, optimizer: str = "sgd", readout=nn.Linear):
        self.optimizer = optimizer
        self.readout = readout

    def build_model(self, config):
        w = config["width"]
        return nn.Sequential(nn.Linear(64, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), self.readout(w, 10))

    def build_optimizer(self, model, config):
        params, lr, wd = model.parameters(), config["lr"], config.get("weight_decay", 0.0)
        if self.optimizer == "sgd":
            return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=wd)
        if self.optimizer == "adamw":
            return torch.optim.AdamW(params, lr=lr, weight_decay=wd)
        if self.optimizer == "lbfgs":
            return torch.optim.LBFGS(params, lr=lr)
        return torch.optim.Adam(params, lr=lr, weight_decay=wd)


CONFIG = {"width": 64, "lr": 0.05, "weight_decay": 1e-3}


def _data(n=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g)


def _train(model, opt, steps, x, y):
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


# --- the rules, by name ------------------------------------------------------------------------
def test_rules_classify_input_hidden_output_and_biases():
    t = target_trainer(DeepMLP(), 4)
    torch.manual_seed(0)
    model = t.build_model(CONFIG)
    rules = t.rules(model, CONFIG)
    assert {n: r.kind for n, r in rules.items()} == {
        "0.weight": Kind.VECTOR, "0.bias": Kind.VECTOR, "2.weight": Kind.HIDDEN, "2.bias": Kind.VECTOR,
        "4.weight": Kind.OUTPUT, "4.bias": Kind.FIXED}
    sgd = {n: r.lr_mult(Family.SGD) for n, r in rules.items()}
    adam = {n: r.lr_mult(Family.ADAM) for n, r in rules.items()}
    assert sgd == {"0.weight": 4, "0.bias": 4, "2.weight": 1, "2.bias": 4, "4.weight": 0.25, "4.bias": 1}
    assert adam == {"0.weight": 1, "0.bias": 1, "2.weight": 0.25, "2.bias": 1, "4.weight": 0.25, "4.bias": 1}
    assert rules["4.weight"].init_scale == pytest.approx(0.5)      # 1/sqrt(4)
    assert rules["2.bias"].init_scale == pytest.approx(2.0)        # sqrt(fan-in multiplier) of 2.weight
    assert rules["0.bias"].init_scale == 1.0                       # its weight's fan-in is the fixed input


def test_the_surrogate_is_the_base_and_trains_as_the_trainer_itself():
    user, sur = DeepMLP(), surrogate_trainer(DeepMLP(), 4)
    torch.manual_seed(3)
    own = user.build_model({**CONFIG, "width": 16})
    torch.manual_seed(3)
    model = sur.build_model(CONFIG)
    assert [tuple(p.shape) for p in model.parameters()] == [tuple(p.shape) for p in own.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), own.parameters()))
    assert all(r.lr_mult(f) == 1 and r.init_scale == 1 for r in sur.rules(model, CONFIG).values() for f in Family)
    opt = sur.build_optimizer(model, CONFIG)
    assert [g["lr"] for g in opt.param_groups] == [CONFIG["lr"]]


def test_a_bigger_ratio_scales_more_and_nothing_is_read_from_tensors():
    shapes = {"w": (256, 256), "r.weight": (10, 256)}
    base = {"w": (32, 32), "r.weight": (10, 32)}
    rules = param_rules(shapes, base, module_kind=lambda name: "linear" if name.startswith("r.") else "other")
    assert rules["w"].lr_mult(Family.ADAM) == 1 / 8 and rules["w"].lr_mult(Family.SGD) == 1
    assert rules["r.weight"].kind is Kind.OUTPUT and rules["r.weight"].lr_mult(Family.SGD) == 1 / 8


def test_three_growing_dimensions_have_no_rule():
    with pytest.raises(SpecError, match="p has 3 dimensions that grow"):
        param_rules({"p": (8, 8, 8)}, {"p": (2, 2, 2)})


# --- what survives -----------------------------------------------------------------------------
def _groups(opt, model):
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: (g["lr"], g["weight_decay"]) for g in opt.param_groups for p in g["params"]}


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_multipliers_survive_state_dict_deepcopy_and_stack_module_state(optimizer):
    t = target_trainer(DeepMLP(optimizer), 4)
    x, y = _data()
    torch.manual_seed(1)
    model = t.build_model(CONFIG)
    opt = t.build_optimizer(model, CONFIG)
    _train(model, opt, 3, x, y)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, buf)
    twin = copy.deepcopy(model)
    assert _groups(t.build_optimizer(twin, CONFIG), twin) == _groups(opt, model)

    torch.manual_seed(99)            # another init: the checkpoint replaces it
    restored = t.build_model(CONFIG)
    ropt = t.build_optimizer(restored, CONFIG)
    state = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    restored.load_state_dict(state["model"])
    ropt.load_state_dict(state["optimizer"])
    assert _groups(ropt, restored) == _groups(opt, model)
    _train(model, opt, 3, x, y)
    _train(restored, ropt, 3, x, y)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), restored.parameters()))

    params, _ = torch.func.stack_module_state([model, twin])
    mults = t.lr_multipliers(model, CONFIG, Family.ADAM if optimizer != "sgd" else Family.SGD)
    assert set(params) == set(mults)
    assert {n: lr for n, (lr, _) in _groups(opt, model).items()} == pytest.approx(
        {n: CONFIG["lr"] * m for n, m in mults.items()})


def test_param_groups_the_user_made_are_split_within_each():
    class TwoGroups(DeepMLP):
        def build_optimizer(self, model, config):
            head = list(model[4].parameters())
            rest = [p for n, p in model.named_parameters() if not n.startswith("4.")]
            return torch.optim.SGD([{"params": rest}, {"params": head, "lr": 0.5}], lr=config["lr"])

    t = target_trainer(TwoGroups(), 2)
    model = t.build_model(CONFIG)
    groups = _groups(t.build_optimizer(model, CONFIG), model)
    assert groups["4.weight"][0] == pytest.approx(0.25) and groups["4.bias"][0] == 0.5
    assert groups["2.weight"][0] == pytest.approx(0.05) and groups["0.weight"][0] == pytest.approx(0.1)


# --- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize("config, message", [
    ({"lr": 0.1}, "width key 'width' is not in the trial's config"),
    ({"width": 64.5}, r"width key width = 64.5 is not a positive integer"),
    ({"width": "64"}, r"width key width = '64' is not a positive integer"),
    ({"width": 36}, "width key width = 36 is not divisible by width_ratio 8; use a multiple of 8"),
])
def test_bad_width_keys_say_which_field(config, message):
    with pytest.raises(SpecError, match=message):
        width_config(DeepMLP(), config, 8)


@pytest.mark.parametrize("ratio", [1, 0, 2.5, True, "8"])
def test_the_ratio_is_an_integer_of_at_least_two(ratio):
    with pytest.raises(SpecError, match="surrogate.width_ratio: expected an integer of at least 2"):
        surrogate_trainer(DeepMLP(), ratio)


def test_a_trainer_without_width_keys_is_refused():
    class NoWidth(DeepMLP):
        width_keys = ()

    with pytest.raises(SpecError, match="trainer NoWidth names no width_keys"):
        target_trainer(NoWidth(), 4)


def test_width_keys_that_change_no_shape_are_refused():
    class Fixed(DeepMLP):
        width_keys = ("lr_scale",)

        def build_model(self, config):
            return super().build_model({**config, "width": 32})

    t = target_trainer(Fixed(), 4)
    with pytest.raises(SpecError, match=r"width keys \(lr_scale\) change no parameter's shape"):
        t.build_model({**CONFIG, "lr_scale": 8})


def test_an_optimizer_without_a_rule_is_named():
    t = target_trainer(DeepMLP("lbfgs"), 4)
    model = t.build_model(CONFIG)
    with pytest.raises(SpecError, match="optimizer LBFGS has no μP rule"):
        t.build_optimizer(model, CONFIG)


# --- against the mup library -------------------------------------------------------------------
def _mup_model(width, base_width, optimizer, seed):
    mup = pytest.importorskip("mup")
    make = DeepMLP(optimizer, readout=mup.MuReadout).build_model
    torch.manual_seed(seed)
    model = make({"width": width})
    mup.set_base_shapes(model, make({"width": base_width}), delta=make({"width": 2 * base_width}))
    return model


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_lr_and_wd_by_name_equal_mups_except_the_readout_it_stores_differently(optimizer):
    mup = pytest.importorskip("mup")
    model = _mup_model(64, 16, optimizer, 0)
    make = {"sgd": mup.MuSGD, "adam": mup.MuAdam, "adamw": mup.MuAdamW}[optimizer]
    theirs = _groups(make(model.parameters(), lr=0.05, weight_decay=1e-3), model)
    t = target_trainer(DeepMLP(optimizer), 4)
    mine_model = t.build_model(CONFIG)
    mine = _groups(t.build_optimizer(mine_model, CONFIG), mine_model)
    for name in ["0.weight", "0.bias", "2.weight", "2.bias", "4.bias"]:
        assert mine[name] == pytest.approx(theirs[name]), name
    # mup: W with a 1/m forward multiplier; here W' = W / m in a plain Linear (module docstring)
    m = 4
    sgd = optimizer == "sgd"
    assert theirs["4.weight"][0] == pytest.approx(0.05 * (m if sgd else 1))
    assert mine["4.weight"][0] == pytest.approx(0.05 / m)


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_training_tracks_mup_step_for_step(optimizer):
    mup = pytest.importorskip("mup")
    theirs = _mup_model(64, 16, optimizer, 7)
    make = {"sgd": mup.MuSGD, "adam": mup.MuAdam, "adamw": mup.MuAdamW}[optimizer]
    opt_theirs = make(theirs.parameters(), lr=0.02, weight_decay=1e-3, **({"momentum": 0.9} if optimizer == "sgd" else {}))
    t = target_trainer(DeepMLP(optimizer), 4)
    torch.manual_seed(7)            # the same draws as mup's model before its rescaling
    mine = t.build_model({**CONFIG, "lr": 0.02})
    opt_mine = t.build_optimizer(mine, {**CONFIG, "lr": 0.02})
    x, y = _data(64)
    assert torch.allclose(mine(x), theirs(x), atol=1e-6)
    for _ in range(5):
        _train(mine, opt_mine, 4, x, y)
        _train(theirs, opt_theirs, 4, x, y)
        assert torch.allclose(mine(x), theirs(x), rtol=1e-4, atol=1e-5)


def test_mups_base_shapes_agree_on_which_dims_grow():
    mup = pytest.importorskip("mup")
    model = _mup_model(64, 16, "sgd", 0)
    t = target_trainer(DeepMLP(), 4)
    rules = param_rules({n: tuple(p.shape) for n, p in model.named_parameters()},
                        {n: tuple(p.shape) for n, p in DeepMLP().build_model({"width": 16}).named_parameters()},
                        module_kind=module_kinds(model))
    for name, p in model.named_parameters():
        assert p.infshape.ninf() == {Kind.FIXED: 0, Kind.VECTOR: 1, Kind.OUTPUT: 1, Kind.HIDDEN: 2}[rules[name].kind]
        assert p.infshape.width_mult() == rules[name].width_mult
    assert t.rules(t.build_model(CONFIG), CONFIG) == rules
    del mup


# --- in the worker, unchanged ------------------------------------------------------------------
def test_a_worker_builds_checkpoints_and_restores_the_target_with_its_groups():
    from rubberband.examples.digits import DigitsMLP
    from rubberband.executor.worker import DDPWorker

    config = {"hidden": 64, "lr": 0.1, "momentum": 0.9, "weight_decay": 0.0}

    w = DDPWorker(target_trainer(DigitsMLP(), 8), seed=0)
    w.warmup()       # builds the data once (the trainer's data_depends_on_config, passed through)
    w.assign(config, None)
    assert sorted(g["lr"] for g in w.opt.param_groups) == pytest.approx([0.1 / 8, 0.1, 0.1 * 8])
    x, y = next(w._batches)
    w.opt.zero_grad()
    w.trainer.loss(w.model(x), y).backward()
    w.opt.step()
    blob = w.checkpoint()
    fresh = DDPWorker(target_trainer(DigitsMLP(), 8), seed=1)
    fresh.warmup()
    fresh.assign(config, blob)
    assert [g["lr"] for g in fresh.opt.param_groups] == [g["lr"] for g in w.opt.param_groups]
    assert all(torch.equal(a, b) for a, b in zip(w.model.parameters(), fresh.model.parameters()))
    assert fresh.opt.state_dict()["state"].keys() == w.opt.state_dict()["state"].keys()


def test_the_wrappers_pickle_as_a_ray_actor_argument_does():
    import pickle

    t = pickle.loads(pickle.dumps(target_trainer(DeepMLP("adam"), 4)))
    assert (t.ratio, t.divisor, t.width_keys, t.trainer.optimizer) == (4, 1, ("width",), "adam")
    assert t.global_batch_size == DeepMLP.global_batch_size
