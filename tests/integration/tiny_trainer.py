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
