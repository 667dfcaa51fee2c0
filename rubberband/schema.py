"""Small schema checks for YAML input: reject unknown keys, require fields, suggest fixes."""

from __future__ import annotations

import difflib
import math
from collections.abc import Hashable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from rubberband.errors import SpecError


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """Return ``' (did you mean `x`?)'`` for the closest choice, or ``''``."""
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f" (did you mean `{close[0]}`?)" if close else ""


def check_mapping(value: Any, where: str, *, required: Iterable[str] = (),
                  optional: Iterable[str] = ()) -> dict[str, Any]:
    """Check that ``value`` is a mapping with all ``required`` keys and no unknown ones.

    ``where`` names the mapping (``cloud.overrides``); ``""`` is a file's top level, whose
    keys are named alone.
    """
    if not isinstance(value, Mapping):
        raise SpecError(f"{where or 'top level'}: expected a mapping of keys to values, got {type(value).__name__}")
    required, optional = list(required), list(optional)
    allowed = list(dict.fromkeys(required + optional))

    def field(key: Any) -> str:
        return f"{where}.{key}" if where else str(key)

    for key in value:
        if key not in allowed:
            raise SpecError(f"{field(key)}: unknown key{did_you_mean(key, allowed)}; allowed keys: {', '.join(allowed)}")
    for key in required:
        if key not in value or value[key] is None:
            raise SpecError(f"{field(key)}: missing required field")
    return dict(value)


def strings(value: Any, where: str, what: str = "strings") -> list[str]:
    """Check a list of strings (shell commands, subnet ids, ...)."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SpecError(f"{where}: expected a list of {what}, got {value!r}")
    return list(value)


def number(value: Any, where: str, *, minimum: float | None = None, positive: bool = False) -> float:
    """Check a finite real number, optionally ``> 0`` or ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SpecError(f"{where}: expected a number, got {value!r}")
    if positive and value <= 0:
        raise SpecError(f"{where}: must be greater than 0, got {value!r}")
    if minimum is not None and value < minimum:
        raise SpecError(f"{where}: must be at least {minimum:g}, got {value!r}")
    return float(value)


def integer(value: Any, where: str, *, minimum: int = 1) -> int:
    """Check an integer of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value != int(value):
        raise SpecError(f"{where}: expected an integer, got {value!r}")
    if value < minimum:
        raise SpecError(f"{where}: must be at least {minimum}, got {value!r}")
    return int(value)


def choice(value: Any, where: str, choices: Iterable[str]) -> str:
    """Check that ``value`` is one of ``choices``."""
    choices = list(choices)
    if not isinstance(value, str) or value not in choices:
        raise SpecError(f"{where}: unknown value {value!r}{did_you_mean(value, choices)}; choose one of {', '.join(choices)}")
    return value


class UniqueKeyLoader(yaml.SafeLoader):
    """A safe YAML loader that refuses a key given twice in one mapping.

    PyYAML keeps the last value silently, so a second ``deadline:`` further down a file would
    quietly win over the first; YAML itself says keys are unique.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        # An explicit ``!!map`` tag on another node reaches here too: PyYAML refuses it below.
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                # `<<` merge keys may repeat and may be overridden: that is what they are for.
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node)
                if key in first:
                    raise yaml.constructor.ConstructorError(
                        None, None,
                        f"duplicate key `{key}` (first given at line {first[key].start_mark.line + 1}); keep one of them",
                        key_node.start_mark,
                    )
                first[key] = key_node
        return super().construct_mapping(node, deep)


def load_yaml(path: str | Path, what: str = "file") -> dict[Any, Any]:
    """Read a YAML mapping from ``path`` with one-line errors for missing, empty or broken files
    and for a key given twice."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"{what}: no such file {str(path)!r}")
    try:
        data = yaml.load(path.read_text(), Loader=UniqueKeyLoader)  # noqa: S506 - a safe loader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise SpecError(f"{path}: not valid YAML{where}: {problem}") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not a text file; expected YAML") from None
    if data is None:
        raise SpecError(f"{path}: the file is empty; expected a YAML mapping")
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a YAML mapping at the top level, got {type(data).__name__}")
    return data


def jsonable(value: Any) -> Any:
    """``json.dumps`` default for rubberband values: numpy arrays and scalars, enums, the rest as text."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "value"):
        return value.value
    return str(value)
