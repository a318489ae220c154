"""Structured attribute values and the slot that keeps an attribute's source text.

An instruction's attributes are `Attr` slots in source order.  A slot parsed
from text keeps that text and prints it back unchanged; its typed value is read
on first use (`Instruction.attr`).  A slot a pass sets holds only the typed value
and prints it with the value's `to_hlo()` (or the plain-value rules in
`format_plain_value`).  Keys no reader knows stay text forever.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, cast

_UNSET = object()

# Readers turn an attribute's text into its typed value, per key.  The IR does not know the
# grammar: the front end (parse/attribute_reader.py) registers its readers here when it is
# imported, which happens before any text reaches the IR.
_READERS: dict[str, Callable[[str], Any]] = {}


def register_readers(readers: dict[str, Callable[[str], Any]]) -> None:
    _READERS.update(readers)


def reader_for(key: str) -> Callable[[str], Any] | None:
    """The reader of attribute `key`'s text (None: the text is the value)."""
    return _READERS.get(key)


class Attr:
    """One `key=value` attribute: source text, typed value, or both."""

    __slots__ = ("raw", "_value")

    def __init__(self, raw: str | None = None, value: Any = _UNSET):
        if raw is None and value is _UNSET:
            raise ValueError("an attribute needs text or a value")
        self.raw = raw
        self._value = value

    def value(self, reader: Callable[[str], Any] | None) -> Any:
        if self._value is _UNSET:
            if reader is None:
                return self.raw
            self._value = reader(cast(str, self.raw))  # a slot without a value has text
        return self._value

    def text(self, key: str) -> str:
        if self.raw is not None:
            return self.raw
        return format_plain_value(key, self._value)

    def __repr__(self) -> str:
        return f"Attr({self.raw!r})" if self.raw is not None else f"Attr(value={self._value!r})"


# Attributes whose value is a quoted string in HLO text.
STRING_KEYS = frozenset({
    "custom_call_target", "opaque", "async_execution_thread", "backend_config_string",
    "execution_thread",
})


def quote(text: str) -> str:
    """A C-escaped, double-quoted HLO string."""
    return json.dumps(text, ensure_ascii=False)


def format_plain_value(key: str, value: Any) -> str:
    """Print a typed value that has no `to_hlo` of its own."""
    if hasattr(value, "to_hlo"):
        return cast(str, value.to_hlo())
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, tuple):
        return "{" + ",".join(format_plain_value(key, v) for v in value) + "}"
    if isinstance(value, str):
        return quote(value) if key in STRING_KEYS else value
    raise TypeError(f"cannot print attribute {key}={value!r}")


# --------------------------------------------------------------- windows --
@dataclass(frozen=True, slots=True)
class WindowDimension:
    size: int
    stride: int = 1
    padding_low: int = 0
    padding_high: int = 0
    lhs_dilation: int = 1
    rhs_dilation: int = 1
    reversal: bool = False


@dataclass(frozen=True, slots=True)
class Window:
    """`window={size=3x3 stride=2x2 pad=1_1x1_1 lhs_dilate=.. rhs_dilate=.. rhs_reversal=..}`."""

    dimensions: tuple[WindowDimension, ...]

    def windowed_dims(self) -> list[int]:
        """The dims whose window does more than take each element in place: a size, stride,
        padding or dilation other than the identity's (a reversal of a one-element window
        changes nothing)."""
        return [d for d, w in enumerate(self.dimensions)
                if (w.size, w.stride, w.padding_low, w.padding_high, w.lhs_dilation, w.rhs_dilation)
                != (1, 1, 0, 0, 1, 1)]

    def to_hlo(self) -> str:
        dims = self.dimensions
        if not dims:
            return "{}"
        parts = ["size=" + "x".join(str(d.size) for d in dims)]
        if any(d.stride != 1 for d in dims):
            parts.append("stride=" + "x".join(str(d.stride) for d in dims))
        if any(d.padding_low or d.padding_high for d in dims):
            parts.append("pad=" + "x".join(f"{d.padding_low}_{d.padding_high}" for d in dims))
        if any(d.lhs_dilation != 1 for d in dims):
            parts.append("lhs_dilate=" + "x".join(str(d.lhs_dilation) for d in dims))
        if any(d.rhs_dilation != 1 for d in dims):
            parts.append("rhs_dilate=" + "x".join(str(d.rhs_dilation) for d in dims))
        if any(d.reversal for d in dims):
            parts.append("rhs_reversal=" + "x".join(str(int(d.reversal)) for d in dims))
        return "{" + " ".join(parts) + "}"


@dataclass(frozen=True, slots=True)
class SliceSpec:
    """`slice={[start:limit:stride], ...}`."""

    starts: tuple[int, ...]
    limits: tuple[int, ...]
    strides: tuple[int, ...]

    def to_hlo(self) -> str:
        dims = []
        for s, l, st in zip(self.starts, self.limits, self.strides):
            dims.append(f"[{s}:{l}]" if st == 1 else f"[{s}:{l}:{st}]")
        return "{" + ", ".join(dims) + "}"


@dataclass(frozen=True, slots=True)
class PaddingConfig:
    """`padding=lo_hi_interior x ...` per dimension."""

    dimensions: tuple[tuple[int, int, int], ...]

    def to_hlo(self) -> str:
        return "x".join(f"{lo}_{hi}" + (f"_{it}" if it else "") for lo, hi, it in self.dimensions)


@dataclass(frozen=True, slots=True)
class ConvDimensionLabels:
    """`dim_labels=b01f_01io->b01f`: which dimension is batch/feature/spatial in each operand."""

    input: str
    kernel: str
    output: str

    def to_hlo(self) -> str:
        return f"{self.input}_{self.kernel}->{self.output}"

    @staticmethod
    def _spatial(labels: str) -> tuple[int, ...]:
        digits = sorted((int(c), i) for i, c in enumerate(labels) if c.isdigit())
        return tuple(i for _, i in digits)

    @property
    def input_batch(self) -> int:
        return self.input.index("b")

    @property
    def input_feature(self) -> int:
        return self.input.index("f")

    @property
    def input_spatial(self) -> tuple[int, ...]:
        return self._spatial(self.input)

    @property
    def kernel_input_feature(self) -> int:
        return self.kernel.index("i")

    @property
    def kernel_output_feature(self) -> int:
        return self.kernel.index("o")

    @property
    def kernel_spatial(self) -> tuple[int, ...]:
        return self._spatial(self.kernel)

    @property
    def output_batch(self) -> int:
        return self.output.index("b")

    @property
    def output_feature(self) -> int:
        return self.output.index("f")

    @property
    def output_spatial(self) -> tuple[int, ...]:
        return self._spatial(self.output)


@dataclass(frozen=True, slots=True)
class OpMetadata:
    """`metadata={op_type="dot" op_name="jit(f)/dot" source_file="f.py" source_line=3 ...}`.

    Fields are kept in source order; values are str (strings, words) or int.
    """

    fields: tuple[tuple[str, str | int], ...] = ()

    def get(self, key: str, default: str | int | None = None) -> str | int | None:
        for k, v in self.fields:
            if k == key:
                return v
        return default

    @property
    def op_name(self) -> str | None:
        return cast("str | None", self.get("op_name"))

    @property
    def source_file(self) -> str | None:
        return cast("str | None", self.get("source_file"))

    @property
    def source_line(self) -> int | None:
        return cast("int | None", self.get("source_line"))

    @property
    def stack_frame_id(self) -> int | None:
        return cast("int | None", self.get("stack_frame_id"))

    def with_fields(self, **updates: str | int) -> "OpMetadata":
        fields = [(k, updates.pop(k)) if k in updates else (k, v) for k, v in self.fields]
        fields += list(updates.items())
        return OpMetadata(tuple(fields))

    def to_hlo(self) -> str:
        parts = []
        for k, v in self.fields:
            if isinstance(v, int):
                parts.append(f"{k}={v}")
            else:
                parts.append(f"{k}={quote(v)}")
        return "{" + " ".join(parts) + "}"


@dataclass(frozen=True, slots=True)
class ShapeList:
    """`operand_layout_constraints={f32[4,8]{0,1}, s32[4]{0}}`: one shape (with its layout) per
    operand of a custom-call."""

    shapes: tuple[Any, ...]  # Shape values (ir/shape.py, which this module does not import)

    def to_hlo(self) -> str:
        return "{" + ", ".join(s.to_hlo() for s in self.shapes) + "}"


@dataclass(frozen=True, slots=True)
class FrontendAttributes:
    """`frontend_attributes={key="value", ...}`; non-string values are kept as their text."""

    entries: tuple[tuple[str, str], ...] = ()  # value: the decoded string, or raw text for groups
    raw_value_keys: frozenset[str] = frozenset()

    def get(self, key: str, default: str | None = None) -> str | None:
        for k, v in self.entries:
            if k == key:
                return v
        return default

    def to_hlo(self) -> str:
        parts = [f"{k}={v if k in self.raw_value_keys else quote(v)}" for k, v in self.entries]
        return "{" + ",".join(parts) + "}"


@dataclass(frozen=True, slots=True)
class OutputOperandAliasing:
    """`output_to_operand_aliasing={{0}: (1, {}), {1}: (0, {0})}` on a fusion or custom-call:
    the output at each shape index shares the buffer of an operand (at its shape index).  After
    copy insertion that operand's buffer is written in place (ir/buffers.py)."""

    entries: tuple[tuple[tuple[int, ...], int, tuple[int, ...]], ...] = ()  # (output, operand, operand index)

    @property
    def operands(self) -> frozenset[int]:
        """The operand positions whose buffers the outputs take over."""
        return frozenset(operand for _, operand, _ in self.entries)

    def to_hlo(self) -> str:
        def index(ix: tuple[int, ...]) -> str:
            return "{" + ",".join(map(str, ix)) + "}"

        return "{" + ", ".join(f"{index(out)}: ({operand}, {index(ix)})"
                               for out, operand, ix in self.entries) + "}"


# ----------------------------------------------------------------- typed views --
@dataclass(frozen=True, slots=True)
class DotDimensions:
    """A dot's dimension numbers (absent lists are empty, as in XLA)."""

    lhs_batch: tuple[int, ...] = ()
    rhs_batch: tuple[int, ...] = ()
    lhs_contracting: tuple[int, ...] = ()
    rhs_contracting: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class GatherDimensions:
    offset_dims: tuple[int, ...] = ()
    collapsed_slice_dims: tuple[int, ...] = ()
    start_index_map: tuple[int, ...] = ()
    index_vector_dim: int = 0
    slice_sizes: tuple[int, ...] = ()
    operand_batching_dims: tuple[int, ...] = ()
    start_indices_batching_dims: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ScatterDimensions:
    update_window_dims: tuple[int, ...] = ()
    inserted_window_dims: tuple[int, ...] = ()
    scatter_dims_to_operand_dims: tuple[int, ...] = ()
    index_vector_dim: int = 0
    input_batching_dims: tuple[int, ...] = ()
    scatter_indices_batching_dims: tuple[int, ...] = ()
