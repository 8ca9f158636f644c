"""The run config's text around validation: ``key=value`` overrides applied to the parsed
YAML (:func:`apply_overrides`), and where a YAML error is and every validation problem on
one line (:func:`yaml_position`, :func:`format_validation_error`)."""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import ValidationError

from dynamics.engine.config_sections import ConfigError


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (value parsed as YAML) to a nested dict copy.
    List items are addressed by index or, for ``datasets``, by dataset name."""
    import copy

    out = copy.deepcopy(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(
                f"override {item!r} must look like key.path=value, e.g. training.total_steps=256"
            )
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw else None
        except yaml.YAMLError:
            value = raw
        parts = key.strip().split(".")
        node: Any = out
        for depth, part in enumerate(parts[:-1]):
            node = _child(node, part, ".".join(parts[: depth + 1]), create=True)
        last = parts[-1]
        if isinstance(node, list):
            node[_list_index(node, last, key)] = value
        elif isinstance(node, dict):
            node[last] = value
        else:
            raise ConfigError(f"override {key!r}: {'.'.join(parts[:-1])} is not a section")
    return out


def _child(node: Any, part: str, path: str, create: bool) -> Any:
    if isinstance(node, dict):
        if part not in node or node[part] is None:
            node[part] = {}
        return node[part]
    if isinstance(node, list):
        return node[_list_index(node, part, path)]
    raise ConfigError(f"override path {path!r} goes through a value that is not a section")


def _list_index(node: list[Any], part: str, path: str) -> int:
    if part.isdigit() and int(part) < len(node):
        return int(part)
    for i, item in enumerate(node):
        if isinstance(item, dict) and item.get("name") == part:
            return i
    raise ConfigError(f"override path {path!r}: no list item with index or name {part!r}")


def yaml_position(err: yaml.YAMLError) -> str:
    """``: line L, column C: problem`` of a YAML error, on one line."""
    mark = getattr(err, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(err, "problem", None) or str(err)
    context = getattr(err, "context", None)
    text = f"{problem} ({context})" if context else str(problem)
    return f"{where}: {' '.join(text.split())}"


def format_validation_error(err: ValidationError) -> str:
    """All problems on one line: ``field.path: message; ...``."""
    lines = []
    for problem in err.errors():
        # A key with a line break or other unprintable characters is shown escaped.
        location = ".".join(
            str(p) if str(p).isprintable() else repr(str(p)) for p in problem["loc"]
        )
        message = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden":
            message = "unknown field; check the spelling (see docs/config.md for every field)"
        elif problem["type"] == "missing":
            message = "required field is missing"
        message = " ".join(message.split())  # a message never spans lines
        lines.append(f"{location}: {message}" if location else message)
    return "invalid config: " + "; ".join(lines)
