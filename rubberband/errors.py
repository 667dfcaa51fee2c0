"""Exception types shared by every layer of rubberband."""

from __future__ import annotations


class RubberbandError(Exception):
    """Base class for every error rubberband raises on purpose."""


class SpecError(RubberbandError, ValueError):
    """Bad user input: an experiment, profile, allocation or option that cannot be used.

    The message is one line that names the field, what was wrong and how to fix it.
    """


class RubberbandWarning(UserWarning):
    """Input that can be used but looks wrong; the CLI prints it as one ``warning: ...`` line."""


class InfeasibleDeadlineError(RubberbandError):
    """No allocation plan meets the deadline.

    Attributes:
        deadline_s: the deadline that was asked for.
        min_jct_s: the shortest achievable (mean) job completion time.
        allocation: the allocation that achieves ``min_jct_s``.
        confidence: the probability the deadline had to be met with, or ``None`` (mean JCT).
        needed_s: the shortest deadline that plan meets: ``min_jct_s``, or with a confidence
            ``p`` its JCT's ``p``-quantile (a mean below the deadline is not enough).
    """

    def __init__(self, deadline_s: float, min_jct_s: float, allocation: tuple[int, ...], detail: str = "",
                 confidence: float | None = None, needed_s: float | None = None):
        import math

        self.deadline_s = deadline_s
        self.min_jct_s = min_jct_s
        self.allocation = tuple(allocation)
        self.confidence = confidence
        self.detail = detail
        self.needed_s = min_jct_s if needed_s is None else needed_s
        alloc = ",".join(str(a) for a in self.allocation)
        # Round the advice up: a deadline rounded down could still be missed.
        at_least = f"{math.ceil(self.needed_s - 1e-9):.0f}s" if math.isfinite(self.needed_s) else "more"
        if confidence is None:
            msg = (f"no plan meets the deadline of {deadline_s:.0f}s; the shortest achievable JCT is "
                   f"{min_jct_s:.0f}s with allocation {alloc}{detail} — raise the deadline to at least "
                   f"{at_least} or shrink the job")
        else:
            msg = (f"no plan meets the deadline of {deadline_s:.0f}s with probability {confidence:g}; the fastest "
                   f"plan (allocation {alloc}{detail}) has a mean JCT of {min_jct_s:.0f}s but finishes in time "
                   f"with probability {confidence:g} only by {at_least} — raise the deadline to at least "
                   f"{at_least}, lower the confidence or shrink the job")
        super().__init__(msg)


class ProviderError(RubberbandError):
    """A cloud or local provider failed to do what was asked."""
