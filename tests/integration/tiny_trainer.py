"""Small trainers for the executor's integration tests (real PyTorch, real DDP)."""

from rubberband.examples.digits import DigitsMLP


class Tiny(DigitsMLP):
    """Five optimizer steps of a batch of 32 per iteration: fast."""

    steps_per_iter = 5
    global_batch_size = 32


class Slow(DigitsMLP):
    """About a third of a second per iteration, so a test can act in the middle of a stage."""

    steps_per_iter = 150
    global_batch_size = 64


class Failing(Tiny):
    """Fails when a trial's model is built."""

    def build_model(self, config):
        raise RuntimeError("boom: this trainer cannot build its model")


class Sleepy(DigitsMLP):
    """One optimizer step per iteration plus a sleep, so a trial on m GPUs runs m times faster
    and trials on separate GPUs run side by side on a 2-core machine (the sleep takes no CPU).

    Its first ``FAST_ITERS`` iterations sleep ``ITER_S / world_size`` seconds (its profile:
    ``ITER_S`` at one GPU, perfect scaling), every later one ``SLOWDOWN`` times that. The count
    travels in the optimizer's state (``param_groups``, saved in every checkpoint), so a trial
    resumed from its checkpoint, on other GPUs or after a SYNC, keeps its pace."""

    steps_per_iter = 1
    global_batch_size = 32
    ITER_S = 0.25
    SLOWDOWN = 3.0
    FAST_ITERS = 0

    def build_optimizer(self, model, config):
        import time

        import torch.distributed as dist

        opt = super().build_optimizer(model, config)
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        opt.param_groups[0]["sleepy_steps"] = 0
        step = opt.step

        def slow_step(*args, **kwargs):
            group = opt.param_groups[0]      # after a restore: the checkpoint's (load_state_dict replaces it)
            slow = self.SLOWDOWN if group["sleepy_steps"] >= self.FAST_ITERS * self.steps_per_iter else 1.0
            time.sleep(self.ITER_S * slow / world)
            group["sleepy_steps"] += 1
            return step(*args, **kwargs)

        opt.step = slow_step
        return opt


class SlowAfterStage0(Sleepy):
    """On its profile for its first 4 iterations (stage 0 of the closed-loop re-planning test),
    then twice as slow (as if a contended GPU or a slower data phase set in): only the TRAINs
    after stage 0 show it, so only a re-plan at a later SYNC can react."""

    FAST_ITERS = 4
    SLOWDOWN = 2.0


class Paced(Sleepy):
    """Always at its profile's pace (the closed-loop aws test: spot reclaims, not the pace, are
    what goes wrong)."""

    ITER_S = 0.5
    SLOWDOWN = 1.0
