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
    """One optimizer step per iteration plus a sleep: ``ITER_S * SLOWDOWN / world_size``
    seconds per iteration, so a trial on m GPUs runs m times faster and trials on separate
    GPUs run side by side on a 2-core machine (the sleep takes no CPU). ``SLOWDOWN`` is how
    much slower than its profile (``ITER_S`` at one GPU, perfect scaling) it really runs."""

    steps_per_iter = 1
    global_batch_size = 32
    ITER_S = 0.25
    SLOWDOWN = 3.0

    def build_optimizer(self, model, config):
        import time

        import torch.distributed as dist

        opt = super().build_optimizer(model, config)
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        step = opt.step

        def slow_step(*args, **kwargs):
            time.sleep(self.ITER_S * self.SLOWDOWN / world)
            return step(*args, **kwargs)

        opt.step = slow_step
        return opt
