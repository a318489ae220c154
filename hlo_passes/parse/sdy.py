"""Readers for the Shardy attribute strings in frontend attributes (grammar/sdy.lark).

    read_meshes('{mesh = #sdy.mesh<["x"=4, "y"=2]>}')     -> {"mesh": SdyMesh(...)}
    read_sharding('#sdy.sharding<@mesh, [{"x"}, {}]>')     -> SdySharding(...)
    read_sharding_per_value('#sdy.sharding_per_value<[<@mesh, [{"x"}]>]>') -> (SdySharding, ...)
    read_manual_axes('#sdy<manual_axes{"x"}>')             -> (AxisRef("x"),)

Errors raise `SdyAttributeError` naming what was expected.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, cast

import lark

from hlo_passes.ir.sdy import AxisRef, DimSharding, SdyMesh, SdySharding

GRAMMAR_PATH = Path(__file__).resolve().parents[1] / "grammar" / "sdy.lark"  # package data

_STARTS = ("sdy_meshes", "sdy_sharding", "sdy_sharding_per_value", "sdy_manual_axes")


class SdyAttributeError(ValueError):
    """A Shardy attribute string that does not read as expected."""


class _Build(lark.Transformer[lark.Token, Any]):
    def STRING(self, t: lark.Token) -> str:
        return cast(str, json.loads(t.value))

    def NAME(self, t: lark.Token) -> str:
        return cast(str, t.value)

    def INT(self, t: lark.Token) -> int:
        return int(t.value)

    def int_seq(self, c: list[int]) -> tuple[int, ...]:
        return tuple(c)

    def mesh_axis(self, c: list[Any]) -> tuple[str, int]:
        return (c[0], c[1])

    def mesh_body(self, c: list[Any]) -> SdyMesh:
        axes = tuple(x for x in c if isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str))
        ids = next((x for x in c if isinstance(x, tuple) and x and isinstance(x[0], int)), ())
        return SdyMesh(axes, ids)

    def mesh_entry(self, c: list[Any]) -> tuple[str, SdyMesh]:
        return c[0], c[1]

    def sdy_meshes(self, c: list[Any]) -> Mapping[str, SdyMesh]:
        # Read-only: the result is cached (`_read`) and handed to every reader of the same text.
        return MappingProxyType(dict(x for x in c if x is not None))

    def axis_ref(self, c: list[Any]) -> AxisRef:
        if len(c) == 3:
            return AxisRef(c[0], c[1], c[2])
        return AxisRef(c[0])

    def dim_axes(self, c: list[Any]) -> tuple[tuple[AxisRef, ...], bool]:
        refs = tuple(x for x in c if isinstance(x, AxisRef))
        return refs, any(isinstance(x, lark.Token) and x.type == "OPEN" for x in c)

    def open_only(self, c: list[Any]) -> tuple[tuple[AxisRef, ...], bool]:
        return (), True

    def dim_sharding(self, c: list[Any]) -> DimSharding:
        axes: tuple[AxisRef, ...] = ()
        is_open, priority = False, None
        for x in c:
            if isinstance(x, tuple):
                axes, is_open = x
            elif isinstance(x, lark.Token) and x.type == "PRIORITY":
                priority = int(x.value[1:])
        return DimSharding(axes, is_open, priority)

    def sharding_extra(self, c: list[Any]) -> tuple[str, tuple[AxisRef, ...]]:
        return c[0].value, tuple(x for x in c[1:] if x is not None)

    def mesh_by_name(self, c: list[Any]) -> Any:
        return c[0]

    def mesh_inline(self, c: list[Any]) -> Any:
        return c[0]

    def tensor_sharding(self, c: list[Any]) -> SdySharding:
        mesh = c[0]
        dims = tuple(x for x in c[1:] if isinstance(x, DimSharding))
        extras: dict[str, tuple[AxisRef, ...]] = dict(x for x in c[1:] if isinstance(x, tuple))
        return SdySharding(mesh, dims, extras.get("replicated", ()), extras.get("unreduced", ()))

    def value_sharding(self, c: list[Any]) -> Any:
        return c[0]

    def sdy_sharding(self, c: list[Any]) -> Any:
        return c[0]

    def sdy_sharding_per_value(self, c: list[Any]) -> tuple[SdySharding, ...]:
        return tuple(x for x in c if x is not None)

    def sdy_manual_axes(self, c: list[Any]) -> tuple[AxisRef, ...]:
        return tuple(x for x in c if x is not None)


@functools.cache  # built once; Lark parsers are reentrant
def _parser() -> lark.Lark:
    return lark.Lark(GRAMMAR_PATH.read_text(), parser="lalr", lexer="contextual", start=list(_STARTS),
                     maybe_placeholders=True)


# Shared by every module and thread: text -> a frozen value or a read-only mapping of them
# (lru_cache is thread-safe; each read makes its own transformer; failures are not cached).
@functools.lru_cache(maxsize=4096)
def _read(start: str, text: str) -> Any:
    try:
        return _Build().transform(_parser().parse(text, start=start))
    except lark.exceptions.UnexpectedInput as e:
        expected = sorted(getattr(e, "expected", None) or getattr(e, "allowed", None) or ())
        pos: int | None = getattr(e, "pos_in_stream", None)
        got = text[pos:pos + 12] if pos is not None else "?"
        raise SdyAttributeError(
            f"cannot read {start.replace('_', ' ')} '{text}': at column {getattr(e, 'column', '?')} "
            f"expected {' or '.join(expected) or 'more input'}, got '{got}'") from None
    except lark.exceptions.LarkError as e:
        raise SdyAttributeError(f"cannot read {start.replace('_', ' ')} '{text}': {e}") from None


def read_meshes(text: str) -> Mapping[str, SdyMesh]:
    return cast("Mapping[str, SdyMesh]", _read("sdy_meshes", text))


def read_sharding(text: str) -> SdySharding:
    return cast(SdySharding, _read("sdy_sharding", text))


def read_sharding_per_value(text: str) -> tuple[SdySharding, ...]:
    return cast("tuple[SdySharding, ...]", _read("sdy_sharding_per_value", text))


def read_manual_axes(text: str) -> tuple[AxisRef, ...]:
    return cast("tuple[AxisRef, ...]", _read("sdy_manual_axes", text))
