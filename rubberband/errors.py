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
    """

    def __init__(self, deadline_s: float, min_jct_s: float, allocation: tuple[int, ...], detail: str = ""):
        self.deadline_s = deadline_s
        self.min_jct_s = min_jct_s
        self.allocation = tuple(allocation)
        alloc = ",".join(str(a) for a in self.allocation)
        msg = (
            f"no plan meets the deadline of {deadline_s:.0f}s; the shortest achievable JCT is "
            f"{min_jct_s:.0f}s with allocation {alloc}{detail} — raise the deadline to at least "
            f"{min_jct_s:.0f}s or shrink the job"
        )
        super().__init__(msg)


class ProviderError(RubberbandError):
    """A cloud or local provider failed to do what was asked."""
