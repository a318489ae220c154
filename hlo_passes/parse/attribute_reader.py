"""Typed readings of attribute values, by attribute key.

`reader_for(key)` returns a function from the value's text to its typed value,
or None for keys that stay text.  Structured values are parsed with the
grammar's `attr_*` start rules; results are cached by text because the same
sharding or replica-group spelling repeats thousands of times in big dumps.
"""

from __future__ import annotations

import functools
import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Iterable, NamedTuple, cast

import lark
from lark import Token

from hlo_passes.ir.attributes import (ConvDimensionLabels, FrontendAttributes, OpMetadata, OutputOperandAliasing,
                                      PaddingConfig, ShapeList, SliceSpec, Window, WindowDimension, register_readers)
from hlo_passes.ir.sdy import AxisRef, SdyMesh, mesh_sharding
from hlo_passes.ir.replica_groups import ReplicaGroups
from hlo_passes.ir.sharding import IotaDevices, Sharding, ShardingKind, SubgroupKind
from hlo_passes.parse import grammar
from hlo_passes.parse.limits import MAX_DEVICES, parse_int64, quote
from hlo_passes.parse.opcode_attributes import split_top_level
from hlo_passes.parse.shapes import parse_shape

if TYPE_CHECKING:
    import numpy as np
else:
    from hlo_passes._deferred import numpy as np  # deferred: fmt never needs numpy


class AttributeError_(ValueError):
    """An attribute value that does not read as its key requires."""


def _axis_ref(selected: tuple[str, int | None, int | None]) -> AxisRef:
    """('x', None, None) for a whole axis, ('x', 2, 2) for the sub-axis 'x':(2)2."""
    name, pre_size, size = selected
    return AxisRef(name, pre_size or 1, size)


def _ints(items: Iterable[Any]) -> tuple[int, ...]:
    try:
        return tuple(parse_int64(str(x)) for x in items)
    except ValueError as e:
        raise AttributeError_(str(e)) from None


def _device_count(dims: Iterable[int], what: str) -> int:
    """The product of `dims`, refused past MAX_DEVICES before anything is expanded."""
    n = 1
    for d in dims:
        if d < 0:
            raise AttributeError_(f"{what}: negative size {d}")
        n *= d
        if n > MAX_DEVICES:
            raise AttributeError_(f"{what} names more than {MAX_DEVICES:,} devices (MAX_DEVICES)")
    return n


# What the sharding rules hand each other (the kinds `replicated`, `manual`, `unknown` are a
# ShardingKind, an iota device list an IotaDevices, an explicit one a tuple of ints).
class _Maximal(NamedTuple):
    device: int
    single_device: bool = False  # spelled `single_device[device_id=N]`


class _Tiled(NamedTuple):
    tile_dims: tuple[int, ...]
    devices: tuple[int, ...] | IotaDevices


class _Subgroups(NamedTuple):
    """`last_tile_dim_replicate` (spelled as the flag) or `last_tile_dims={...}`."""

    kinds: tuple[SubgroupKind, ...]
    spelled_as_flag: bool


class _Metadata(NamedTuple):
    text: str  # the `metadata={...}` group, as written


class _ShardGroup(NamedTuple):
    group: tuple[str, int]  # ("shard_as" | "shard_like", id), as Sharding keeps it


class _MeshDeviceIds(NamedTuple):
    ids: tuple[int, ...]


class _DimAxes(NamedTuple):
    axes: tuple[AxisRef, ...]
    open: bool  # ends with `?`


class _NamedDims(NamedTuple):
    dims: tuple[_DimAxes, ...]


class _ReplicatedAxes(NamedTuple):
    axes: tuple[AxisRef, ...]


class _UnreducedAxes(NamedTuple):
    axes: tuple[AxisRef, ...]


class _ManualAxes(NamedTuple):
    axes: tuple[AxisRef, ...]


_WHOLE: dict[ShardingKind, Callable[[], Sharding]] = {
    ShardingKind.REPLICATED: Sharding.replicated, ShardingKind.MANUAL: Sharding.manual,
    ShardingKind.UNKNOWN: Sharding.unknown,
}


class _TypedBuilder(lark.Transformer[lark.Token, Any]):
    """Reads one attribute value's parse tree; made for each value read (it keeps the value's
    text, `raw`, which groups are sliced from), so reads on several threads share nothing."""

    def __init__(self, raw: str):
        super().__init__()
        self.raw = raw

    # shared pieces
    def int_seq(self, c: list[Any]) -> Any:
        return _ints(c)

    def int_group(self, c: list[Any]) -> Any:
        return c[0] if c else ()

    def iota_transpose(self, c: list[Any]) -> Any:
        return c[0]

    def group(self, c: list[Any]) -> Any:
        first, last = c[0], c[-1]
        start = first.start_pos if isinstance(first, lark.Token) else first[0]
        end = last.end_pos if isinstance(last, lark.Token) else last[1]
        return start, end

    inner_group = group

    def _text(self, span: tuple[int, int]) -> str:
        return self.raw[span[0]:span[1]]

    # sharding
    def replicated(self, c: list[Any]) -> ShardingKind:
        return ShardingKind.REPLICATED

    def manual(self, c: list[Any]) -> ShardingKind:
        return ShardingKind.MANUAL

    def unknown(self, c: list[Any]) -> ShardingKind:
        return ShardingKind.UNKNOWN

    def maximal(self, c: list[Any]) -> _Maximal:
        return _Maximal(_ints(c)[0])

    def single_device(self, c: list[Any]) -> _Maximal:
        return _Maximal(_ints(c)[0], single_device=True)

    def explicit_devices(self, c: list[Any]) -> tuple[int, ...]:
        return _ints(c)

    def iota_devices(self, c: list[Any]) -> IotaDevices:
        _device_count(c[0], "the iota device list")
        perm = c[1] if len(c) > 1 else ()
        _check_iota_transposed(c[0], perm)
        if perm and list(perm) == list(range(len(perm))):  # `<=[2,2]T(0,1)` is `<=[4]`, as XLA prints it
            return IotaDevices((_prod(c[0]),), ())
        if perm and sorted(perm) != list(range(len(c[0]))):
            raise AttributeError_(f"iota transpose T{perm} is not a permutation of {len(c[0])} dimensions")
        return IotaDevices(c[0], perm)

    def tiled(self, c: list[Any]) -> _Tiled:
        _device_count(c[0], "the tile assignment")
        return _Tiled(c[0], c[1])

    def last_tile_dim_replicate(self, c: list[Any]) -> _Subgroups:
        return _Subgroups((SubgroupKind.REPLICATED,), spelled_as_flag=True)

    def subgroup_kind(self, c: list[Any]) -> SubgroupKind:
        return SubgroupKind(c[0].value)

    def last_tile_dims(self, c: list[Any]) -> _Subgroups:
        return _Subgroups(tuple(c), spelled_as_flag=False)

    def sharding_metadata(self, c: list[Any]) -> _Metadata:
        text = self._text(c[0])
        _check_sharding_metadata(text)
        return _Metadata(text)

    def shard_as(self, c: list[Any]) -> _ShardGroup:
        return _ShardGroup(("shard_as", _ints(c)[0]))

    def shard_like(self, c: list[Any]) -> _ShardGroup:
        return _ShardGroup(("shard_like", _ints(c)[0]))

    def sharding_body(self, c: list[Any]) -> Sharding:
        kind, options = c[0], c[1:]
        subgroups: tuple[SubgroupKind, ...] = ()
        flag, metadata, shard_group = True, "", None
        for opt in options:
            if type(opt) is _Subgroups:
                subgroups, flag = opt.kinds, opt.spelled_as_flag
            elif type(opt) is _Metadata:
                metadata = opt.text
            else:
                shard_group = cast(_ShardGroup, opt).group
        if type(kind) is _Tiled:
            tile_dims, devices = kind.tile_dims, kind.devices
            if len(subgroups) > len(tile_dims):
                raise AttributeError_(f"last_tile_dims names {len(subgroups)} subgroup dimensions, more than the "
                                      f"{len(tile_dims)} dimensions of the tile assignment")
            iota: IotaDevices | None
            if type(devices) is IotaDevices:
                iota, ids = devices, devices.expand()
                if len(ids) != _prod(tile_dims):
                    raise AttributeError_(f"iota of {len(ids)} devices for a tile grid of {_prod(tile_dims)}")
            else:
                iota, ids = None, np.asarray(devices)
                if len(ids) != _prod(tile_dims):
                    raise AttributeError_(f"{len(ids)} devices listed for a tile grid of {_prod(tile_dims)}")
            s = Sharding.tiled(np.asarray(ids).reshape(tile_dims), subgroups, iota=iota,
                               replicate_spelled_as_flag=flag, metadata=metadata,
                               devices_spelled_explicitly=iota is None)
        elif type(kind) is _Maximal:
            s = Sharding.maximal(kind.device)
            if kind.single_device:
                s = replace(s, single_device_spelling=True)
        else:
            s = _WHOLE[kind]()
        if metadata or shard_group:
            s = replace(s, metadata=metadata, shard_group=shard_group)
        return s

    def attr_sharding(self, c: list[Any]) -> Any:
        return c[0]

    # named (mesh-form) sharding
    def named_mesh(self, c: list[Any]) -> Any:
        axes = tuple(x for x in c if x is not None)
        _check_mesh_axes(axes)
        _device_count([size for _, size in axes], "the mesh")
        return SdyMesh(axes)

    def mesh_device_ids(self, c: list[Any]) -> _MeshDeviceIds:
        return _MeshDeviceIds(c[0])

    def named_replicated(self, c: list[Any]) -> ShardingKind:
        return ShardingKind.REPLICATED

    def named_manual(self, c: list[Any]) -> ShardingKind:
        return ShardingKind.MANUAL

    def named_unknown(self, c: list[Any]) -> ShardingKind:
        return ShardingKind.UNKNOWN

    def dim_axes(self, c: list[Any]) -> _DimAxes:
        """The axes splitting a dimension, and whether it ends with `?`."""
        axes = tuple(_axis_ref(x) for x in c if isinstance(x, tuple))
        return _DimAxes(axes, any(isinstance(x, Token) and x.type == "OPEN_DIM" for x in c))

    def named_dims(self, c: list[Any]) -> _NamedDims:
        return _NamedDims(tuple(x for x in c if x is not None))

    def named_replicated_axes(self, c: list[Any]) -> _ReplicatedAxes:
        return _ReplicatedAxes(tuple(_axis_ref(x) for x in c if x is not None))

    def named_unreduced_axes(self, c: list[Any]) -> _UnreducedAxes:
        return _UnreducedAxes(tuple(_axis_ref(x) for x in c if x is not None))

    def named_manual_axes(self, c: list[Any]) -> _ManualAxes:
        return _ManualAxes(tuple(_axis_ref(x) for x in c if x is not None))

    def named_sharding(self, c: list[Any]) -> Sharding:
        mesh, rest = c[0], [x for x in c[1:] if x is not None]
        if type(rest[0]) is _MeshDeviceIds:
            mesh, rest = replace(mesh, device_ids=rest[0].ids), rest[1:]
        spec, options = rest[0], rest[1:]
        metadata = next((o.text for o in options if type(o) is _Metadata), "")
        unreduced = next((o.axes for o in options if type(o) is _UnreducedAxes), ())
        if type(spec) is not _NamedDims:
            if unreduced:
                raise AttributeError_(f"unreduced axes on a {spec.value} sharding")
            s = _WHOLE[spec]()
        else:
            manual = next((o.axes for o in options if type(o) is _ManualAxes), ())
            try:
                s = mesh_sharding(mesh, [d.axes for d in spec.dims], manual, unreduced)
            except (KeyError, ValueError) as e:
                raise AttributeError_(str(e)) from None
            open_dims = tuple(i for i, d in enumerate(spec.dims) if d.open)
            if open_dims:
                s = replace(s, open_dims=open_dims)
        return replace(s, metadata=metadata or s.metadata, named_mesh=True)

    def tuple_sharding(self, c: list[Any]) -> Any:
        return Sharding.tuple_of(c)

    def empty_tuple_sharding(self, c: list[Any]) -> Any:
        return Sharding.tuple_of(())

    # replica groups
    def explicit_groups(self, c: list[Any]) -> Any:
        if sum(len(g) for g in c) > MAX_DEVICES:
            raise AttributeError_(f"replica groups name more than {MAX_DEVICES:,} devices (MAX_DEVICES)")
        return ReplicaGroups.explicit(c)

    def iota_groups(self, c: list[Any]) -> Any:
        dims = c[0]
        if len(dims) != 2:
            raise AttributeError_("iota replica groups need [num_groups,group_size]")
        if _device_count(dims, "the replica groups") != _device_count(c[1], "the iota device list"):
            raise AttributeError_(f"replica groups {list(dims)} do not cover the iota of {list(c[1])} devices")
        perm = c[2] if len(c) > 2 else ()
        _check_iota_transposed(c[1], perm)
        if perm and list(perm) == list(range(len(perm))):  # `<=[2,2]T(0,1)` is `<=[4]`, as XLA prints it
            return ReplicaGroups.from_iota((dims[0], dims[1]), IotaDevices((_prod(c[1]),), ()))
        return ReplicaGroups.from_iota((dims[0], dims[1]), IotaDevices(c[1], perm))

    def mesh_axis(self, c: list[Any]) -> Any:
        return c[0].value.strip("'"), _ints([c[1]])[0]

    def mesh_selected(self, c: list[Any]) -> Any:
        name = c[0].value.strip("'")
        return (name, *_ints(c[1:3])) if len(c) == 3 else (name, None, None)

    def mesh_groups(self, c: list[Any]) -> Any:
        ids = next((x.ids for x in c if type(x) is _MeshDeviceIds), ())
        c = [x for x in c if x is not None and type(x) is not _MeshDeviceIds]
        axes = [x for x in c if len(x) == 2]
        _check_mesh_axes(axes)
        selected = [x for x in c if len(x) == 3]
        return ReplicaGroups.from_mesh(axes, selected, spelling="", device_ids=tuple(ids))

    def attr_pairs(self, c: list[Any]) -> Any:
        return tuple(c)

    def attr_int_list(self, c: list[Any]) -> Any:
        return c[0] if c else ()

    def slice_dim(self, c: list[Any]) -> Any:
        v = _ints(c)
        return v if len(v) == 3 else (v[0], v[1], 1)

    def attr_slice(self, c: list[Any]) -> Any:
        return SliceSpec(tuple(d[0] for d in c), tuple(d[1] for d in c), tuple(d[2] for d in c))

    def attr_padding(self, c: list[Any]) -> Any:
        dims = []
        for part in c[0].value.split("x"):
            nums = _ints(part.split("_"))
            dims.append((nums[0], nums[1], nums[2] if len(nums) > 2 else 0))
        return PaddingConfig(tuple(dims))

    def window_field(self, c: list[Any]) -> Any:
        return c[0].value, c[1].value.split("x")

    def attr_window(self, c: list[Any]) -> Any:
        fields = dict(c)
        n = len(fields.get("size", []))
        dims = []
        for i in range(n):
            pad = fields.get("pad", ["0_0"] * n)[i].split("_")
            def at(key: str, default: str) -> int:
                values = fields.get(key, [default] * n)
                if len(values) != n:
                    raise AttributeError_(f"expects '{key}=' has the same size as 'size='")
                return _ints([values[i]])[0]

            dims.append(WindowDimension(
                size=at("size", "1"), stride=at("stride", "1"), padding_low=_ints([pad[0]])[0],
                padding_high=_ints([pad[1]])[0], lhs_dilation=at("lhs_dilate", "1"),
                rhs_dilation=at("rhs_dilate", "1"), reversal=at("rhs_reversal", "0") == 1))
        return Window(tuple(dims))

    def attr_dim_labels(self, c: list[Any]) -> Any:
        lhs, out = c[0].value.split("->")
        inp, kernel = lhs.split("_")
        return ConvDimensionLabels(inp, kernel, out)

    def metadata_field(self, c: list[Any]) -> Any:
        v = c[1]
        if v.type == "STRING":
            return c[0].value, _unquote(v.value)
        if v.type == "INT":
            return c[0].value, _ints([v.value])[0]
        return c[0].value, v.value

    def attr_metadata(self, c: list[Any]) -> Any:
        return OpMetadata(tuple(c))

    def frontend_entry(self, c: list[Any]) -> Any:
        v = c[1]
        if isinstance(v, lark.Token) and v.type == "STRING":
            return c[0].value, _unquote(v.value), False
        return c[0].value, self._text(v), True

    def attr_frontend_attributes(self, c: list[Any]) -> Any:
        return FrontendAttributes(tuple((k, v) for k, v, _ in c),
                                  frozenset(k for k, _, raw in c if raw))


def _unquote(text: str) -> str:
    from hlo_passes.parse.strings import unquote

    try:
        return unquote(text)
    except ValueError as e:
        raise AttributeError_(str(e)) from None


def _check_sharding_metadata(text: str) -> None:
    """A sharding's metadata={...} or metadata={{...}, {...}}: each an op's metadata, as XLA reads it."""
    from hlo_passes.parse.opcode_attributes import check_metadata, split_top_level

    body = text.strip()
    inner = body[1:-1].strip()
    items = split_top_level(inner) if inner.startswith("{") else [body]
    for item in items:
        if item.strip():
            check_metadata(item.strip())


def _check_mesh_axes(axes: Iterable[tuple[str, int]]) -> None:
    """A mesh's axes: distinct names, positive sizes (XLA's Mesh aborts the process otherwise)."""
    seen: set[str] = set()
    for name, size in axes:
        if name in seen:
            raise AttributeError_(f"mesh has duplicate axis names: {quote(name)}")
        seen.add(name)
        if size <= 0:
            raise AttributeError_(f"mesh axis {quote(name)} has size {size}; mesh axis sizes must be positive")


def _check_iota_transposed(reshape: tuple[int, ...], perm: tuple[int, ...]) -> None:
    """XLA reads `<=[a,b,...]` (more than one dimension) only with its transpose `T(...)` after it."""
    if len(reshape) > 1 and not perm:
        raise AttributeError_(f"expected 'T(' after the iota reshape dimensions {list(reshape)} (an iota "
                              "over one dimension is written <=[n])")


def _prod(xs: Iterable[int]) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def _structured(start: str) -> Callable[[str], Any]:
    """The reader of values spelled by the grammar's rule `start`.  Its cache is shared by every
    module and thread: it maps a value's text to a frozen value (Sharding, Window, ...), and
    lru_cache is thread-safe; a failed read is not cached."""

    @functools.lru_cache(maxsize=4096)
    def read(raw: str) -> Any:
        try:
            return _TypedBuilder(raw).transform(grammar.compiled().parse(raw, start=start))
        except lark.exceptions.VisitError as e:
            raise AttributeError_(f"{start[5:]}: {e.orig_exc}") from None
        except RecursionError:
            raise AttributeError_(f"{start[5:].replace('_', ' ')} is nested too deeply to read") from None
        except lark.exceptions.UnexpectedInput as e:
            from hlo_passes.parse.module_parser import lark_error_message  # it imports this module

            pos, message = lark_error_message(raw, e)
            raise AttributeError_(f"cannot read {start[5:].replace('_', ' ')} {quote(raw)}: {message} (at "
                                  f"character {pos + 1} of the value)") from None
        except lark.exceptions.LarkError as e:
            first = str(e).strip().splitlines()[0]
            raise AttributeError_(f"cannot read {start[5:].replace('_', ' ')} {quote(raw)}: {first}") from None

    return read


def _read_int(raw: str) -> int:
    """ASCII digits within int64, as XLA's lexer reads integers (no `1_000`, no other scripts)."""
    try:
        return parse_int64(raw)
    except ValueError as e:
        raise AttributeError_(str(e)) from None


def _read_float(raw: str) -> float:
    if not re.fullmatch(r"-?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+(?:[eE][-+]?[0-9]+)?|inf)", raw):
        raise AttributeError_(f"expects a number, got {raw!r}")
    return float(raw)


def _read_bool(raw: str) -> bool:
    if raw not in ("true", "false"):
        raise AttributeError_(f"expected true or false, got '{raw}'")
    return raw == "true"


def _read_string(raw: str) -> str:
    if raw.startswith('"'):
        return _unquote(raw)
    return raw


def _read_shape_list(raw: str) -> ShapeList:
    """`{f32[4,8]{0,1}, s32[4]{0}}`: shapes with layouts (custom-call layout constraints)."""
    body = raw.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise AttributeError_(f"expected {{shape, ...}}, got '{raw}'")
    return ShapeList(tuple(parse_shape(part.strip()) for part in split_top_level(body[1:-1]) if part.strip()))


def _read_bool_list(raw: str) -> tuple[bool, ...]:
    """`{true,false}` (one flag per entry parameter or output leaf) or a single `true`."""
    body = raw[1:-1] if raw.startswith("{") and raw.endswith("}") else raw
    return tuple(_read_bool(part.strip()) for part in body.split(",") if part.strip())


@functools.lru_cache(maxsize=4096)
def _read_int_list(raw: str) -> tuple[int, ...]:
    """`{1,0}`: read directly (thousands per dump, before the grammar is even built); other
    spellings go through the grammar."""
    if raw.startswith("{") and raw.endswith("}"):
        body = raw[1:-1].strip()
        try:
            return tuple(parse_int64(x.strip()) for x in body.split(",")) if body else ()
        except ValueError:
            pass
    return cast("tuple[int, ...]", _structured("attr_int_list")(raw))


_ALIASING_ENTRY = re.compile(r"\{([0-9,\s]*)\}\s*:\s*\(\s*([0-9]+)\s*,\s*\{([0-9,\s]*)\}\s*\)")


def _read_output_operand_aliasing(raw: str) -> OutputOperandAliasing:
    """`{{0}: (1, {}), {1}: (0, {0})}`, checked entry by entry."""
    body = raw.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise AttributeError_(f"expected {{<output index>: (<operand>, <operand index>), ...}}, got '{raw}'")
    entries = []
    parts = split_top_level(body[1:-1])
    if parts and not parts[-1].strip():
        parts = parts[:-1]  # XLA's list reader takes a trailing comma (and `{}`)
    for part in parts:
        m = _ALIASING_ENTRY.fullmatch(part.strip())
        if m is None:
            raise AttributeError_(f"expected <output index>: (<operand>, <operand index>), got '{part.strip()}'")
        out, operand, index = m.groups()
        entries.append((_ints(x.strip() for x in out.split(",") if x.strip()), _read_int(operand),
                        _ints(x.strip() for x in index.split(",") if x.strip())))
    return OutputOperandAliasing(tuple(entries))


def _read_word(raw: str) -> str:
    return raw


def _read_replica_groups(raw: str) -> ReplicaGroups:
    groups: ReplicaGroups = _structured("attr_replica_groups")(raw)
    if raw.startswith("mesh"):
        return ReplicaGroups(groups.groups, mesh_spelling=raw)
    return groups


_INT_LIST_KEYS = (
    "dimensions", "lhs_contracting_dims", "rhs_contracting_dims", "lhs_batch_dims", "rhs_batch_dims",
    "slice_sizes", "offset_dims", "collapsed_slice_dims", "start_index_map", "update_window_dims",
    "inserted_window_dims", "scatter_dims_to_operand_dims", "dynamic_slice_sizes", "fft_length",
    "operand_batching_dims", "start_indices_batching_dims", "input_batching_dims",
    "scatter_indices_batching_dims", "lhs_ragged_dims", "rhs_group_dims",
)
_INT_KEYS = (
    "index", "index_vector_dim", "channel_id", "iota_dimension", "feature_index", "k",
    "exponent_bits", "mantissa_bits", "feature_group_count", "batch_group_count",
    "split_dimension", "concat_dimension", "all_gather_dimension", "replica_count",
    "num_partitions", "parameter_number", "num_carries", "delta", "inferred_dimension",
)
_BOOL_KEYS = (
    "use_global_device_ids", "constrain_layout", "indices_are_sorted", "unique_indices", "is_stable",
    "largest", "custom_call_has_side_effect", "is_host_transfer", "is_scheduled", "is_reverse",
    "is_associative", "left_side", "lower", "unit_diagonal", "is_composite", "has_dynamic_root",
)
_STRING_KEYS = ("custom_call_target", "execution_thread", "async_execution_thread", "opaque")

READERS: dict[str, Callable[[str], Any]] = {
    "sharding": _structured("attr_sharding"),
    "replica_groups": _read_replica_groups,
    "source_target_pairs": _structured("attr_pairs"),
    "slice": _structured("attr_slice"),
    "padding": _structured("attr_padding"),
    "window": _structured("attr_window"),
    "dim_labels": _structured("attr_dim_labels"),
    "metadata": _structured("attr_metadata"),
    "frontend_attributes": _structured("attr_frontend_attributes"),
    "epsilon": _read_float,
    "direction": _read_word,
    "type": _read_word,
    "kind": _read_word,
    "distribution": _read_word,
    "api_version": _read_word,
    "backend_config": _read_string,
    "allow_spmd_sharding_propagation_to_parameters": _read_bool_list,
    "allow_spmd_sharding_propagation_to_output": _read_bool_list,
    "parameter_replication": _read_bool_list,
    "operand_layout_constraints": _read_shape_list,
    "output_to_operand_aliasing": _read_output_operand_aliasing,
    **{k: _read_int_list for k in _INT_LIST_KEYS},
    **{k: _read_int for k in _INT_KEYS},
    **{k: _read_bool for k in _BOOL_KEYS},
    **{k: _read_string for k in _STRING_KEYS},
}


register_readers(READERS)  # the IR reads attribute text through these


def reader_for(key: str) -> Callable[[str], Any] | None:
    return READERS.get(key)
