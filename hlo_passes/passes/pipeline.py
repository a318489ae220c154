"""Pipeline strings: `spmd-partition{num-partitions=8},dce,collective-fusion{threshold-bytes=1048576}`.

Option names are kebab-case spellings of the pass's `Options` fields; values are
converted by the field's type (int, float, bool as true/false, str).  Unknown
passes, options and bad values are rejected before anything runs, and a parsed
pipeline prints back to the same string (options equal to their defaults are
not printed).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hlo_passes.passes.pass_base import ModulePass
from hlo_passes.passes.registry import all_passes, lookup


class PipelineError(ValueError):
    """A pipeline string that names an unknown pass or option, or a bad value."""


@dataclass
class Pipeline:
    passes: list[ModulePass]

    def __str__(self) -> str:
        return format_pipeline(self.passes)


def _kebab(name: str) -> str:
    return name.replace("_", "-")


def _convert(pass_name: str, field: dataclasses.Field, text: str):
    kind = field.type if isinstance(field.type, type) else {"int": int, "float": float, "bool": bool,
                                                           "str": str}.get(str(field.type), str)
    try:
        if kind is bool:
            if text not in ("true", "false"):
                raise ValueError
            return text == "true"
        if kind is int:
            return int(text)
        if kind is float:
            return float(text)
        return text
    except ValueError:
        raise PipelineError(f"{pass_name}: option {_kebab(field.name)} expects a {kind.__name__}, "
                            f"got {text!r}") from None


def _format_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth < 0:
                raise PipelineError(f"unbalanced '}}' in pipeline {text!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise PipelineError(f"unbalanced '{{' in pipeline {text!r}")
    parts.append(text[start:])
    return [p.strip() for p in parts]


def parse_pass(text: str) -> ModulePass:
    name, _, rest = text.partition("{")
    name = name.strip()
    cls = lookup(name)
    if cls is None:
        raise PipelineError(f"unknown pass {name!r}; known passes: {', '.join(all_passes())}")
    fields = {_kebab(f.name): f for f in dataclasses.fields(cls.Options)}
    values = {}
    if rest:
        if not rest.endswith("}"):
            raise PipelineError(f"{name}: options must end with '}}', got {text!r}")
        for item in filter(None, (x.strip() for x in rest[:-1].split(","))):
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq:
                raise PipelineError(f"{name}: option {key!r} needs a value (as in {key}=...)")
            if key not in fields:
                valid = ", ".join(fields) or "none"
                raise PipelineError(f"{name}: unknown option {key!r}; valid options: {valid}")
            values[fields[key].name] = _convert(name, fields[key], value.strip())
    return cls(**values)


def parse_pipeline(text: str) -> Pipeline:
    """Build the passes of `text`; raises PipelineError before anything runs."""
    if not text or not text.strip():
        raise PipelineError("empty pipeline")
    return Pipeline([parse_pass(part) for part in _split_top_level(text)])


def format_pass(p: ModulePass) -> str:
    changed = []
    for f in dataclasses.fields(p.options):
        value = getattr(p.options, f.name)
        default = f.default if f.default is not dataclasses.MISSING else None
        if value != default:
            changed.append(f"{_kebab(f.name)}={_format_value(value)}")
    return p.name + ("{" + ",".join(changed) + "}" if changed else "")


def format_pipeline(passes: list[ModulePass]) -> str:
    return ",".join(format_pass(p) for p in passes)


def set_option_everywhere(pipeline: Pipeline, option: str, value) -> None:
    """Set `option` (snake case) on every pass that has it, e.g. `--num-partitions 8`."""
    for i, p in enumerate(pipeline.passes):
        if option in {f.name for f in dataclasses.fields(p.options)}:
            pipeline.passes[i] = type(p)(dataclasses.replace(p.options, **{option: value}))
