"""Parsing and formatting of durations and money for the CLI and YAML files."""

from __future__ import annotations

import math
import re

from rubberband.errors import SpecError

_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:e[-+]?[0-9]+)?"
_BARE = re.compile(rf"\s*({_NUMBER})\s*")
_PART = re.compile(rf"\s*({_NUMBER})\s*([a-z]+)\s*")
_FACTORS = {"d": 86400.0, "day": 86400.0, "days": 86400.0,
            "h": 3600.0, "hr": 3600.0, "hrs": 3600.0, "hour": 3600.0, "hours": 3600.0,
            "m": 60.0, "min": 60.0, "mins": 60.0, "s": 1.0, "sec": 1.0, "secs": 1.0}
_EXAMPLES = "90s, 20m or 1.5h"


def parse_duration(value: object, field: str = "duration") -> float:
    """Turn ``90``, ``"90s"``, ``"20m"``, ``"1.5h"`` or ``"1h02m05s"`` into seconds.

    A duration is a bare number of seconds, or parts with units from the largest down
    (``d``, ``h``, ``m``, ``s``), each at most once, so every duration ``format_duration``
    prints reads back.

    Raises:
        SpecError: naming ``field`` when the value is not a positive duration.
    """
    if isinstance(value, bool):
        raise SpecError(f"{field}: expected a duration such as {_EXAMPLES}, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        parsed = _seconds(str(value).lower())
        if parsed is None:
            raise SpecError(f"{field}: expected a duration such as {_EXAMPLES}, got {value!r}")
        seconds = parsed
    if not math.isfinite(seconds) or seconds <= 0:
        raise SpecError(f"{field}: must be a positive duration, got {value!r}")
    return seconds


def _seconds(text: str) -> float | None:
    """Seconds in ``text``, or None when it is not a duration."""
    bare = _BARE.fullmatch(text)
    if bare:
        return float(bare.group(1))
    seconds, previous, pos = 0.0, math.inf, 0
    while pos < len(text):
        part = _PART.match(text, pos)
        factor = _FACTORS.get(part.group(2)) if part else None
        if part is None or factor is None or factor >= previous:      # not a part, an unknown unit, or `30m1h` / `1m2m`
            return None
        seconds += float(part.group(1)) * factor
        previous, pos = factor, part.end()
    return seconds if pos else None


def parse_range(value: str, field: str = "range") -> list[float]:
    """Parse ``START:STOP:STEP`` (durations, inclusive) or a comma list into seconds."""
    text = str(value)
    if ":" in text:
        parts = text.split(":")
        if len(parts) != 3:
            raise SpecError(f"{field}: expected START:STOP:STEP such as 90m:160m:10m, got {value!r}")
        start, stop, step = (parse_duration(p, field) for p in parts)
        if stop < start:
            raise SpecError(f"{field}: STOP must not be before START in {value!r}")
        count = int(math.floor((stop - start) / step + 1e-9)) + 1
        return [start + i * step for i in range(count)]
    return [parse_duration(p, field) for p in text.split(",") if p.strip()]


def format_duration(seconds: float) -> str:
    """Format seconds as ``1h02m05s``, ``12m30s`` or ``45.2s``; ``parse_duration`` reads each back."""
    if not math.isfinite(seconds):
        return str(seconds)
    if round(seconds, 1) < 60:                     # 59.97 s is 1m00s, not 60.0s
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s"


def format_usd(amount: float) -> str:
    """Format dollars with cents, or four decimals below a dollar."""
    return f"${amount:,.2f}" if abs(amount) >= 1 else f"${amount:.4f}"
