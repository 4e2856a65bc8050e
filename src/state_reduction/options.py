"""Command-line options: argparse types of numeric options (a bad value is a one-line usage error naming the
option) and options generated from config dataclasses (`add_config_options`)."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Callable, Iterable


def _number(kind, least, text: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {'an integer' if kind is int else 'a number'}, got {text!r}") from None
    if value < least or value != value:
        raise argparse.ArgumentTypeError(f"must be >= {least}, got {text}")
    return value


def positive_int(text: str) -> int:
    return _number(int, 1, text)


def length_int(text: str) -> int:
    """A sequence length: at least 2 tokens (one prediction)."""
    return _number(int, 2, text)


def nonnegative_int(text: str) -> int:
    return _number(int, 0, text)


def positive_float(text: str) -> float:
    value = _number(float, 0.0, text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def example_limit(text: str) -> int | float:
    """lm-eval's --limit: a count of examples per task, or a fraction when below 1."""
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"--limit must be positive, got {text}")
    return value if value < 1 else int(value)


def comma_list(text: str) -> list[str]:
    """'ptb,wiki' -> ['ptb', 'wiki']."""
    return [item for item in text.split(",") if item]


def _plain_type(annotation):
    """(type without None, whether None is allowed) of a field annotation such as `int | None`."""
    args = typing.get_args(annotation)
    if type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else str), True
    return annotation, False


def add_config_options(parser: argparse.ArgumentParser, cls, *, positional: Iterable[str] = (),
                       only: Iterable[str] | None = None, skip: Iterable[str] = (), optional: Iterable[str] = (),
                       layered: bool = False, flags: dict[str, str] | None = None,
                       helps: dict[str, str] | None = None, types: dict[str, Callable] | None = None,
                       choices: dict[str, Iterable[str]] | None = None) -> list[str]:
    """One command-line option per field of the dataclass `cls`, so that a config's fields, types and defaults
    are written once, in the dataclass. `--field-name` (or `flags[name]`) sets `args.field_name`; its argparse
    type is `field.metadata["type"]` or `types[name]`, else the annotation (bool: a switch; list[str]: comma
    separated); its help `field.metadata["help"]` or `helps[name]`, with the default appended; its choices
    `field.metadata["choices"]` or `choices[name]`. A field without
    default is required unless listed in `optional` (default None: another check decides). `layered`: every
    default is None, for options that override a preset or YAML layered below them. Fields already defined on
    the parser (another config's) are left as they are. Returns the names of the fields added."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for given in (*positional, *(only or ()), *skip, *optional, *(flags or {}), *(helps or {}), *(types or {}),
                  *(choices or {})):
        if given not in names:
            raise ValueError(f"{cls.__name__} has no field {given!r}; fields: {', '.join(sorted(names))}")
    existing = {action.dest for action in parser._actions}
    added = []
    for f in dataclasses.fields(cls):
        if f.name in existing or f.name in skip or (only is not None and f.name not in only):
            continue
        kind, _ = _plain_type(hints[f.name])
        help_text = (helps or {}).get(f.name, f.metadata.get("help"))
        kwargs = {"help": help_text} if help_text is not None else {}
        if f.name in positional:
            parser.add_argument(f.name, type=(types or {}).get(f.name, f.metadata.get("type", kind)), **kwargs)
            added.append(f.name)
            continue
        flag = (flags or {}).get(f.name, "--" + f.name.replace("_", "-"))
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        required = default is dataclasses.MISSING and f.name not in optional
        if layered or default is dataclasses.MISSING:
            default = None
        elif default is not None and default is not False and default != [] and help_text is not None:
            kwargs["help"] = f"{help_text} (default: {','.join(default) if isinstance(default, list) else default})"
        if kind is bool:
            parser.add_argument(flag, dest=f.name, action="store_true", default=default, **kwargs)
        else:
            if typing.get_origin(kind) is list:
                kind = comma_list
            kind = (types or {}).get(f.name, f.metadata.get("type", kind))
            accepted = (choices or {}).get(f.name, f.metadata.get("choices"))
            parser.add_argument(flag, dest=f.name, type=kind, default=default, required=required,
                                **({"choices": list(accepted)} if accepted else {}), **kwargs)
        added.append(f.name)
    return added


def config_from_args(cls, args: argparse.Namespace, **overrides):
    """`cls(...)` from the parsed options named after its fields (`add_config_options`), then `overrides`."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    return cls(**(values | overrides))
