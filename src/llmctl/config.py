"""Stage configs: typed dataclasses, filled from a TOML file and then from command-line flags.

Precedence, lowest first: the dataclass defaults, `--config` (a path, or a name looked up as
`stages/<stage>/<name>.toml`), `--set` (train), then the flags the user actually typed. Each value
given is checked against its field's type and range (bounds.py) on the way in. The resolved
dataclass is what the stage runs with and what its manifest records.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from llmctl.bounds import check_value, flag_of
from llmctl.errors import UsageError

C = TypeVar("C")


def stages_dirs() -> list[Path]:
    """Where named configs are looked up: ./stages, $LLMCTL_STAGES, then the source checkout's."""
    dirs = [Path.cwd() / "stages"]
    if env := os.environ.get("LLMCTL_STAGES"):
        dirs.append(Path(env))
    dirs.append(Path(__file__).resolve().parents[2] / "stages")
    return dirs


def preset(stage: str, given: str | None, fallback: str = "default") -> str | None:
    """The config a stage runs with: --config when given, else its shipped `fallback` preset
    when one can be found, else None (the dataclass defaults)."""
    if given:
        return given
    return fallback if any((d / stage / f"{fallback}.toml").is_file() for d in stages_dirs()) else None


def find_config(stage: str, name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix == ".toml" or os.sep in name_or_path:
        if not p.is_file():
            raise UsageError(f"config file not found: {p}")
        return p
    for d in stages_dirs():
        cand = d / stage / f"{name_or_path}.toml"
        if cand.is_file():
            return cand
    raise UsageError(f"no config named {name_or_path!r} for {stage} (looked in stages/{stage}/)")


def read_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: invalid TOML ({e})") from e


_TYPE_NAMES = {int: "int", float: "float", str: "str", bool: "bool", dict: "a table"}


def _coerce(where: str, value: Any, hint: Any) -> Any:
    """Check a TOML/--set/flag value against the field's type; accept the obvious widenings.
    `where` names the value's source in the one-line error (a flag, `--set KEY`, `FILE: KEY`)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None:
            return None
        errors = []
        for a in args:
            try:
                return _coerce(where, value, a)
            except UsageError as e:
                errors.append(str(e))
        raise UsageError(errors[0])
    if origin in (list, tuple):
        if isinstance(value, str):  # a flag given as "en,de"
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise UsageError(f"{where}: expected a list, got {value!r}")
        (item,) = typing.get_args(hint)[:1] or (Any,)
        items = [_coerce(where, v, item) for v in value]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        hint = dict
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in _TYPE_NAMES and not (type(value) is hint):
        raise UsageError(f"{where}: expected {_TYPE_NAMES[hint]}, got {value!r}")
    return value


def build_config(cls: type[C], stage: str, config: str | None = None, overrides: dict | None = None,
                 table: str | None = None, sets: dict | None = None) -> C:
    """defaults < TOML file < `--set` < flags, the one way every command builds its config. A
    None in `overrides` (the flags, keyed by field) means 'flag not given'; `config` is a name
    under stages/<stage>/ or a path (see `preset`); `table` reads one table of the file (train
    configs hold [model] and [train]); `sets` are `--set TABLE.KEY=VALUE` values for that table.
    Every given value is checked against the field's type and its range (bounds.BOUNDS), with a
    one-line usage error naming where it came from."""
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    where: dict[str, str] = {}  # key -> the source of its value, for messages
    if config:
        path = find_config(stage, config)
        data = read_toml(path)
        if table is not None:
            data = data.get(table, {})
            if not isinstance(data, dict):
                raise UsageError(f"{path}: [{table}] must be a table")
        unknown = sorted(set(data) - fields)
        if unknown:
            raise UsageError(f"{path}: unknown key(s) {', '.join(unknown)} for {stage} (known: {', '.join(sorted(fields))})")
        base = path.parent
        for k, v in data.items():
            values[k] = _resolve_relative(k, v, base)
            where[k] = f"{path}: {f'[{table}] ' if table else ''}{k}"
    for k, v in (sets or {}).items():
        if k not in fields:
            raise UsageError(f"--set {table}.{k}: unknown key ({table} keys: {', '.join(sorted(fields))})")
        values[k], where[k] = v, f"--set {table}.{k}"
    for k, v in (overrides or {}).items():
        if k not in fields:
            raise KeyError(f"{cls.__name__} has no field {k}")
        if v is not None:
            values[k], where[k] = v, flag_of(cls.__name__, k)
    resolved = {}
    for k, v in values.items():
        resolved[k] = _coerce(where[k], v, hints[k])
        check_value(cls.__name__, k, resolved[k], where[k])
    return cls(**resolved)


def _resolve_relative(key: str, value: Any, base: Path) -> Any:
    """Keys ending in `_file`/`_files` name files relative to the TOML file that mentions them."""
    if key.endswith("_file") and isinstance(value, str) and value:
        return str((base / value).resolve()) if not Path(value).is_absolute() else value
    if key.endswith("_files") and isinstance(value, list):
        return [str((base / v).resolve()) if not Path(v).is_absolute() else v for v in value]
    return value
