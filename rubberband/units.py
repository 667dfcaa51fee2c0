"""Parsing and formatting of durations and money for the CLI and YAML files."""

from __future__ import annotations

import math
import re

from rubberband.errors import SpecError

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(s|sec|secs|m|min|mins|h|hr|hrs|d)?\s*$")
_FACTORS = {None: 1.0, "s": 1.0, "sec": 1.0, "secs": 1.0, "m": 60.0, "min": 60.0, "mins": 60.0,
            "h": 3600.0, "hr": 3600.0, "hrs": 3600.0, "d": 86400.0}


def parse_duration(value: object, field: str = "duration") -> float:
    """Turn ``90``, ``"90s"``, ``"20m"`` or ``"1.5h"`` into seconds.

    Raises:
        SpecError: naming ``field`` when the value is not a positive duration.
    """
    if isinstance(value, bool):
        raise SpecError(f"{field}: expected a duration such as 90s, 20m or 1.5h, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise SpecError(f"{field}: expected a duration such as 90s, 20m or 1.5h, got {value!r}")
        seconds = float(match.group(1)) * _FACTORS[match.group(2)]
    if not math.isfinite(seconds) or seconds <= 0:
        raise SpecError(f"{field}: must be a positive duration, got {value!r}")
    return seconds


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
    """Format seconds as ``1h02m``, ``12m30s`` or ``45.2s``."""
    if not math.isfinite(seconds):
        return str(seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def format_usd(amount: float) -> str:
    """Format dollars with cents, or four decimals below a dollar."""
    return f"${amount:,.2f}" if abs(amount) >= 1 else f"${amount:.4f}"
