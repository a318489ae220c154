"""Pipeline strings: `spmd-partition{num-partitions=8},dce,collective-fusion{combine-threshold-in-bytes=1048576}`.

Option names are kebab-case spellings of the pass's `Options` fields; values are
converted by the field's annotated type:

    int      1048576 (a count, size or threshold: ASCII digits, 0 to 2^63-1)
    float    0.5 (printed by repr: 1e-05)
    bool     true | false     str     packed      (no ',', '{', '}' or '=')
    Enum     one of its values (or names)         Literal["a", "b"]  one of a, b
    T | None none, or a T

Unknown passes, unknown or repeated options and bad values are rejected before
anything runs, naming the valid choices.  A parsed pipeline prints back to the
same string, options equal to their defaults left out:

    >>> str(parse_pipeline("dce{remove-dead-computations=false},cse"))
    'dce{remove-dead-computations=false},cse'

Options that apply to the whole run (`--num-partitions 8`) are set on every pass
that has them with `set_option_everywhere`.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import types
import typing
from dataclasses import dataclass
from typing import Any

from hlo_passes.passes.pass_base import ModulePass
from hlo_passes.passes.registry import all_passes, lookup

_RESERVED = frozenset(",{}=")


class PipelineError(ValueError):
    """A pipeline string that names an unknown pass or option, or a bad value."""


@dataclass
class Pipeline:
    passes: list[ModulePass]

    def __str__(self) -> str:
        return format_pipeline(self.passes)


def kebab(name: str) -> str:
    return name.replace("_", "-")


# ------------------------------------------------------------------ option types --
def option_types(options_cls: type) -> dict[str, Any]:
    """Field name → its resolved annotation (string annotations evaluated in the pass's module)."""
    try:
        return typing.get_type_hints(options_cls)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve: fall back to the text
        return {f.name: f.type for f in dataclasses.fields(options_cls)}


def _optional_inner(kind: Any) -> Any | None:
    """T for `T | None` / Optional[T]; None otherwise."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(kind)) == 2:
            return args[0]
    return None


def describe_type(kind: Any) -> str:
    """How `hlo-passes passes` and error messages name an option's type."""
    inner = _optional_inner(kind)
    if inner is not None:
        return f"{describe_type(inner)} or none"
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return "one of " + "|".join(str(m.value) for m in kind)
    if typing.get_origin(kind) is typing.Literal:
        return "one of " + "|".join(map(str, typing.get_args(kind)))
    if isinstance(kind, type):
        return kind.__name__
    return str(kind)


def convert_value(kind: Any, text: str) -> Any:
    """`text` as a value of annotation `kind`; ValueError saying what was expected."""
    inner = _optional_inner(kind)
    if inner is not None:
        return None if text == "none" else convert_value(inner, text)
    if kind is bool:
        if text not in ("true", "false"):
            raise ValueError("expects true or false")
        return text == "true"
    if kind is int:
        if not (text.isascii() and text.isdigit()) or len(text) > 19 or int(text) >= 1 << 63:
            raise ValueError("expects a whole number, 0 or more")
        return int(text)
    if kind is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError("expects a number") from None
    if kind is str:
        return text
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        for member in kind:
            if text in (str(member.value), member.name, member.name.lower()):
                return member
        raise ValueError(f"expects {describe_type(kind)}")
    if typing.get_origin(kind) is typing.Literal:
        for choice in typing.get_args(kind):
            if text == str(choice):
                return choice
        raise ValueError(f"expects {describe_type(kind)}")
    raise ValueError(f"has type {describe_type(kind)}, which a pipeline string cannot spell")


def format_value(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, float):
        return repr(value)
    text = str(value)
    if _RESERVED & set(text) or not text or text != text.strip():
        raise PipelineError(f"option value {text!r} cannot be written in a pipeline string")
    return text


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


# ----------------------------------------------------------------------- parsing --
def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "{":
            depth += 1
            if depth > 1:
                raise PipelineError(f"nested '{{' at column {i + 1} of pipeline {text!r}")
        elif ch == "}":
            depth -= 1
            if depth < 0:
                raise PipelineError(f"unbalanced '}}' at column {i + 1} of pipeline {text!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise PipelineError(f"unbalanced '{{' in pipeline {text!r}")
    parts.append(text[start:])
    return [p.strip() for p in parts]


def _unknown_pass(name: str) -> PipelineError:
    known = list(all_passes())
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return PipelineError(f"unknown pass {name!r}{hint}; known passes: {', '.join(known)}")


def parse_pass(text: str) -> ModulePass:
    """One `name{opt=val,...}` element of a pipeline."""
    name, brace, rest = text.partition("{")
    name = name.strip()
    if not name:
        raise PipelineError(f"a pipeline element has no pass name: {text!r}")
    cls = lookup(name)
    if cls is None:
        raise _unknown_pass(name)
    fields = {kebab(f.name): f for f in dataclasses.fields(cls.Options)}
    kinds = option_types(cls.Options)
    values: dict[str, Any] = {}
    if brace:
        if not rest.rstrip().endswith("}"):
            raise PipelineError(f"{name}: options must end with '}}', got {text!r}")
        for item in rest.rstrip()[:-1].split(","):
            item = item.strip()
            if not item:
                continue
            key, eq, value = (s.strip() for s in item.partition("="))
            if key not in fields:
                valid = ", ".join(f"{k} ({describe_type(kinds[f.name])})" for k, f in fields.items()) or "none"
                close = difflib.get_close_matches(key, list(fields), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise PipelineError(f"{name}: unknown option {key!r}{hint}; valid options: {valid}")
            if not eq:
                raise PipelineError(f"{name}: option {key!r} needs a value (as in {key}=...)")
            field = fields[key]
            if field.name in values:
                raise PipelineError(f"{name}: option {key!r} is given twice")
            try:
                values[field.name] = convert_value(kinds[field.name], value)
            except ValueError as e:
                raise PipelineError(f"{name}: option {key} {e}, got {value!r}") from None
    try:
        return cls(**values)
    except ValueError as e:  # a pass that checks its options when it is built
        raise PipelineError(str(e) if str(e).startswith(name) else f"{name}: {e}") from None


def parse_pipeline(text: str) -> Pipeline:
    """Build the passes of `text`; raises PipelineError before anything runs."""
    if not text or not text.strip():
        raise PipelineError("empty pipeline")
    return Pipeline([parse_pass(part) for part in _split_top_level(text)])


# ---------------------------------------------------------------------- printing --
def format_pass(p: ModulePass) -> str:
    """`name{opt=val,...}` with only the options that differ from their defaults."""
    changed = []
    for f in dataclasses.fields(p.options):
        value = getattr(p.options, f.name)
        if value != _default(f):
            changed.append(f"{kebab(f.name)}={format_value(value)}")
    return p.name + ("{" + ",".join(changed) + "}" if changed else "")


def format_pipeline(passes: list[ModulePass]) -> str:
    return ",".join(format_pass(p) for p in passes)


# --------------------------------------------------------------- global overrides --
def set_option_everywhere(pipeline: Pipeline, option: str, value: Any) -> list[str]:
    """Set `option` (snake case) on every pass that has it, e.g. `--num-partitions 8`.

    Returns the names of the passes that took it (empty: no pass has the option)."""
    took = []
    for i, p in enumerate(pipeline.passes):
        if option in {f.name for f in dataclasses.fields(p.options)}:
            pipeline.passes[i] = type(p)(dataclasses.replace(p.options, **{option: value}))
            took.append(p.name)
    return took
