"""Rewrite JAX's Shardy-form HLO into the GSPMD form that XLA's SPMD partitioner reads.

With Shardy (JAX's default), some shardings live only in frontend attributes:

    %r = f32[16] custom-call(%x), custom_call_target="xla.sdy.FuncResultSharding",
         frontend_attributes={xla.sdy.sharding="#sdy.sharding_per_value<[<@mesh, [{\\"x\\"}]>]>"}
    %l = f32[4,8] custom-call(%g), custom_call_target="xla.sdy.GlobalToLocalShape", ...
    %c = f32[4,8] call(%l), to_apply=xla.sdy.manual_computation_body.2
    %o = f32[16,8] custom-call(%c), custom_call_target="xla.sdy.LocalToGlobalShape", ...

`import_shardy` makes them HLO shardings:

    %r = f32[16] custom-call(%x), custom_call_target="Sharding", sharding={devices=[4,2]<=[8] last_tile_dim_replicate}
    %s = f32[16,8] custom-call(%g), custom_call_target="Sharding", sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
    %l = f32[4,8] custom-call(%s), custom_call_target="SPMDFullToShardShape", sharding={devices=[1,1,4,2]<=[8] last_tile_dims={manual, replicated}}
    ... and SPMDShardToFullShape on the way out,

gives values inside manual computation bodies their manual shardings (Shardy writes
`{replicated}` there), drops Shardy's `inlineable="xla_late"` from the body calls, marks dimensions Shardy leaves open (`{?}`) as
`backend_config="unspecified_dims=[...]"` on the annotations it writes (as JAX's GSPMD
lowering does; XLA's partitioner needs it for partially manual shard_map regions), and
drops every `xla.sdy.*` frontend attribute, the mesh table included, so the module reads
the same as JAX's GSPMD lowering.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from hlo_passes.ir.attributes import FrontendAttributes, quote
from hlo_passes.ir.builder import Builder
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.sdy import AxisRef, SdyMesh, SdySharding, mesh_sharding, to_hlo_sharding
from hlo_passes.ir.shape import ArrayShape, Shape, TupleShape
from hlo_passes.ir.sharding import Sharding, ShardingKind, SubgroupKind
from hlo_passes.ir.module import Module
from hlo_passes.parse.sdy import read_manual_axes, read_meshes, read_sharding, read_sharding_per_value

SDY_PREFIX = "xla.sdy."
FUNC_RESULT = "xla.sdy.FuncResultSharding"
GLOBAL_TO_LOCAL = "xla.sdy.GlobalToLocalShape"
LOCAL_TO_GLOBAL = "xla.sdy.LocalToGlobalShape"
INLINEABLE = "inlineable"  # Shardy's export marks shard_map body calls inlineable="xla_late"


def _frontend(obj_attr_getter: Callable[..., Any]) -> FrontendAttributes | None:
    value = obj_attr_getter("frontend_attributes")
    return value if isinstance(value, FrontendAttributes) else None


def has_shardy_attributes(module: Module) -> bool:
    fe = _frontend(module.header_attr)
    if fe is not None and any(k.startswith(SDY_PREFIX) for k, _ in fe.entries):
        return True
    return any(i.custom_call_target in (FUNC_RESULT, GLOBAL_TO_LOCAL, LOCAL_TO_GLOBAL)
               for i in module.all_instructions())


def has_partially_manual_regions(module: Module) -> bool:
    """Is some shard_map region manual over only part of its mesh (the other axes left to the
    partitioner)?  XLA's Shardy pipeline aborts the process on such modules (jaxlib 0.12)."""
    fe = _frontend(module.header_attr)
    text = fe.get("xla.sdy.meshes") if fe is not None else None
    meshes = read_meshes(text) if text else {}
    mesh_sizes = [len(m.axes) for m in meshes.values()]
    for instr in module.all_instructions():
        if instr.custom_call_target == GLOBAL_TO_LOCAL:
            axes = _region_axes(instr)
            if mesh_sizes and len(axes) < max(mesh_sizes):
                return True
    return False


def import_shardy(module: Module) -> bool:
    """Convert Shardy-only shardings to HLO ones (see the module docstring); True if anything changed."""
    if not has_shardy_attributes(module):
        return False
    fe = _frontend(module.header_attr)
    meshes: Meshes = {}
    text = fe.get("xla.sdy.meshes") if fe is not None else None
    if text is not None:
        meshes = read_meshes(text)
    manual = _manual_axes_by_computation(module)
    regions = _region_shardings(module)
    for comp in list(module.computations):
        axes = manual.get(comp, ())
        for instr in comp.post_order():
            target = instr.custom_call_target
            if (comp in regions and target not in (GLOBAL_TO_LOCAL, LOCAL_TO_GLOBAL)
                    and _sdy_entry(instr, "xla.sdy.sharding") is None and "sharding" in instr.attributes):
                _exported_body_sharding(instr, regions[comp])
            if target == "Sharding":
                _exported_open_dims(instr)
            elif instr.opcode is not Opcode.CUSTOM_CALL:
                _drop_fully_open(instr)
            if target == FUNC_RESULT:
                _func_result(instr, meshes, axes)
            elif target == GLOBAL_TO_LOCAL:
                _manual_boundary(instr, meshes, entering=True, enclosing=axes)
            elif target == LOCAL_TO_GLOBAL:
                _manual_boundary(instr, meshes, entering=False, enclosing=axes)
            elif axes and _sdy_entry(instr, "xla.sdy.sharding") is not None:
                # Inside a manual body the HLO sharding Shardy writes is not the manual one.
                instr.sharding = _value_sharding(instr, meshes, axes)
                _mark_open_dims(instr, _shardings_of(instr, "xla.sdy.sharding"))
            elif instr.sharding is None and _sdy_entry(instr, "xla.sdy.sharding") is not None:
                instr.sharding = _value_sharding(instr, meshes, axes)
                _mark_open_dims(instr, _shardings_of(instr, "xla.sdy.sharding"))
    for instr in list(module.all_instructions()):
        _drop_sdy_frontend(instr.attr, instr.set_attr, instr.remove_attr)
        if _calls_manual_body(instr, manual):
            # Shardy keeps these calls until late; XLA's GSPMD partitioner aborts on a partially
            # manual body that is still a call (JAX's GSPMD lowering has no such attribute).
            _drop_frontend_keys(instr, (INLINEABLE,))
    _drop_sdy_frontend(module.header_attr, module.set_header_attr, module.attributes.pop)
    return True


# ------------------------------------------------------------------ helpers --
Meshes = Mapping[str, SdyMesh]


def _parent(instr: Instruction) -> Computation:
    comp = instr.parent
    assert comp is not None, f"{instr.name} is in no computation"
    return comp


def _element_shapes(instr: Instruction) -> tuple[Shape, ...]:
    shape = instr.shape
    return shape.elements if isinstance(shape, TupleShape) else (shape,)


def _sdy_entry(instr: Instruction, key: str) -> str | None:
    fe = _frontend(instr.attr)
    return None if fe is None else fe.get(key)


def _shardings_of(instr: Instruction, key: str) -> tuple[SdySharding, ...]:
    text = _sdy_entry(instr, key)
    if text is None:
        return ()
    if text.startswith("#sdy.sharding_per_value"):
        return read_sharding_per_value(text)
    return (read_sharding(text),)


def _value_sharding(instr: Instruction, meshes: Meshes, manual_axes: tuple[AxisRef, ...]) -> Sharding:
    values = _shardings_of(instr, "xla.sdy.sharding")
    shardings = [to_hlo_sharding(v, meshes, manual_axes) for v in values]
    if instr.shape.is_tuple:
        return Sharding.tuple_of(shardings)
    return shardings[0]


def _mark_open_dims(instr: Instruction, values: tuple[SdySharding, ...]) -> None:
    """A `Sharding` custom-call of one value whose open dimensions (`{?}`, `{"x", ?}`) the
    partitioner may shard further: `backend_config="unspecified_dims=[...]"`."""
    if instr.custom_call_target != "Sharding" or len(values) != 1:
        return
    open_dims = [i for i, d in enumerate(values[0].dims) if d.is_open]
    if open_dims:
        _set_unspecified_dims(instr, open_dims)


def _func_result(instr: Instruction, meshes: Meshes, manual_axes: tuple[AxisRef, ...]) -> None:
    """FuncResultSharding -> the value resharded at the function's boundary: a `copy` with the
    result's sharding when every dimension of it is closed, else a `Sharding` annotation (same
    name, same operand) whose open dimensions propagation may fill.

    A closed result sharding belongs to the function's result, not to the value computed inside
    (Shardy's propagation spreads axes; a replicated, closed result adds none to the value that
    feeds it, which keeps the sharding its operands give it and is gathered once at the end).
    A `Sharding` custom-call would say more: XLA's GSPMD propagation hands its sharding to an
    unsharded operand and fixes it there, so `x * 2 + 1` returned replicated from a sharded `x`
    gathered `x * 2` and added on the whole array on every device (8× the FLOPs of XLA's Shardy
    plan on 8 devices)."""
    sharding = _value_sharding(instr, meshes, manual_axes)
    values = _shardings_of(instr, "xla.sdy.sharding")
    comp = _parent(instr)
    if (not manual_axes and instr.shape.is_array and len(values) == 1
            and not any(d.is_open for d in values[0].dims)):
        boundary = Builder(comp, before=instr).op(Opcode.COPY, instr.shape, [instr.operands[0]], name=instr.name)
        boundary.sharding = sharding
        instr.replace_all_uses_with(boundary)
        comp.remove(instr)
        instr = boundary
    else:
        instr.set_attr("custom_call_target", "Sharding")
        instr.remove_attr("custom_call_has_side_effect")
        instr.sharding = sharding
    root = comp.root
    if root is None or root is instr or root.sharding is not None:
        return
    leaves = [o.sharding for o in root.operands if o.custom_call_target == "Sharding" or _is_boundary_copy(o)]
    if root.opcode is Opcode.TUPLE and len(leaves) == len(root.operands):
        known = [leaf for leaf in leaves if leaf is not None and not leaf.is_tuple]
        if len(known) == len(leaves):
            root.sharding = Sharding.tuple_of(known)


def _is_boundary_copy(instr: Instruction) -> bool:
    return instr.opcode is Opcode.COPY and "sharding" in instr.attributes


def _local_sharding(value: SdySharding, meshes: Meshes, manual_axes: tuple[AxisRef, ...]) -> Sharding:
    """The sharding of the per-device part: manual axes are gone from the dims."""
    mesh = value.resolve_mesh(meshes)
    names = {a.name for a in manual_axes}
    dims = [tuple(a for a in d.axes if a.name not in names) for d in value.dims]
    return mesh_sharding(mesh, dims, manual_axes)


def _manual_boundary(instr: Instruction, meshes: Meshes, *, entering: bool,
                     enclosing: tuple[AxisRef, ...] = ()) -> None:
    """GlobalToLocalShape -> Sharding + SPMDFullToShardShape per value;
    LocalToGlobalShape -> Sharding + SPMDShardToFullShape per value.  `enclosing`: the manual
    axes of the shard_map body this region is nested in, manual on both sides of it."""
    comp = _parent(instr)
    manual_axes = _region_axes(instr, enclosing)
    values = _shardings_of(instr, "xla.sdy.in_shardings" if entering else "xla.sdy.out_shardings")
    if not values and "sharding" in instr.attributes:
        _manual_boundary_of_exported(instr, entering=entering)
        return
    shapes = _element_shapes(instr)
    b = Builder(comp, before=instr, metadata=instr.attributes.get("metadata"))
    results = []
    for i, (operand, value) in enumerate(zip(instr.operands, values)):
        global_sharding = to_hlo_sharding(value, meshes, enclosing)
        local = _local_sharding(value, meshes, manual_axes)
        first, second, target = ((global_sharding, local, "SPMDFullToShardShape") if entering
                                 else (local, global_sharding, "SPMDShardToFullShape"))
        annotated = b.op(Opcode.CUSTOM_CALL, operand.shape, [operand], name=instr.name,
                         custom_call_target="Sharding", sharding=first)
        boundary = b.op(Opcode.CUSTOM_CALL, shapes[i], [annotated], name=instr.name,
                        custom_call_target=target, sharding=second)
        open_dims = [d for d, dim in enumerate(value.dims) if dim.is_open]
        if open_dims:
            for op in (annotated, boundary):
                _set_unspecified_dims(op, open_dims)
        results.append(boundary)
    if instr.shape.is_tuple:
        for user in list(instr.users):
            if user.opcode is Opcode.GET_TUPLE_ELEMENT:
                user.replace_all_uses_with(results[user.attr("index")])
                comp.remove(user)
        if instr.users or instr.is_root:
            replacement = b.op(Opcode.TUPLE, instr.shape, results, name=instr.name)
            instr.replace_all_uses_with(replacement)
    else:
        instr.replace_all_uses_with(results[0])
    comp.remove(instr)


def _manual_boundary_of_exported(instr: Instruction, *, entering: bool) -> None:
    """The same boundary as XLA's `before_optimizations` dump of a Shardy-lowered module
    writes it: HLO shardings instead of Shardy attributes.

        %g = (f32[2,8], f32[4,8]) custom-call(%s0, %s1), custom_call_target="xla.sdy.GlobalToLocalShape",
             sharding={{mesh['x'=4,'y'=2], [{?}, {?}], manual={'x'}}, {...}}
        %o = f32[8,8] custom-call(%r), custom_call_target="xla.sdy.LocalToGlobalShape",
             sharding={mesh['x'=4,'y'=2], [{'x'}, {}]}

    Entering, each operand (a `Sharding` custom-call holding the global sharding) goes through
    an SPMDFullToShardShape with the element's local sharding; leaving, each operand is
    annotated with its local sharding (the value's own, else manual) and goes through an
    SPMDShardToFullShape with the element's global sharding."""
    comp = _parent(instr)
    shapes = _element_shapes(instr)
    own = instr.sharding
    assert own is not None  # callers check the instruction has a sharding
    b = Builder(comp, before=instr, metadata=instr.attributes.get("metadata"))
    results = []
    for i, operand in enumerate(instr.operands):
        element = own.element(i) if own.is_tuple else own
        if entering:
            annotated = operand
            if operand.custom_call_target != "Sharding" and operand.sharding is not None:
                annotated = b.op(Opcode.CUSTOM_CALL, operand.shape, [operand], name=instr.name,
                                 custom_call_target="Sharding", sharding=operand.sharding)
            outer = annotated.sharding
            boundary = b.op(Opcode.CUSTOM_CALL, shapes[i], [annotated], name=instr.name,
                            custom_call_target="SPMDFullToShardShape", sharding=element)
        else:
            local = operand.sharding if "sharding" in operand.attributes else None
            if local is not None and local.is_tuple:
                local = None
            annotated = b.op(Opcode.CUSTOM_CALL, operand.shape, [operand], name=instr.name,
                             custom_call_target="Sharding", sharding=local or Sharding.manual())
            outer = element
            boundary = b.op(Opcode.CUSTOM_CALL, shapes[i], [annotated], name=instr.name,
                            custom_call_target="SPMDShardToFullShape", sharding=element)
        open_dims = outer.open_dims if outer is not None and not outer.is_tuple else ()
        if open_dims:
            for op in (annotated, boundary):
                if op is not operand:
                    _set_unspecified_dims(op, open_dims)
        results.append(boundary)
    if instr.shape.is_tuple:
        for user in list(instr.users):
            if user.opcode is Opcode.GET_TUPLE_ELEMENT:
                user.replace_all_uses_with(results[user.attr("index")])
                comp.remove(user)
        if instr.users or instr.is_root:
            instr.replace_all_uses_with(b.op(Opcode.TUPLE, instr.shape, results, name=instr.name))
    else:
        instr.replace_all_uses_with(results[0])
    comp.remove(instr)


def _region_shardings(module: Module) -> dict[Computation, Sharding]:
    """Manual body -> the HLO sharding its call carries in the exported form (one element of it:
    every element has the region's manual groups), for the bodies whose calls say so (the
    exported form has no `xla.sdy.manual_axes` to find them by)."""
    found: dict[Computation, Sharding] = {}
    for instr in module.all_instructions():
        if instr.opcode is not Opcode.CALL or "sharding" not in instr.attributes:
            continue
        s = instr.sharding
        if s is not None and s.is_tuple:
            s = s.elements[0] if s.elements else None
        if s is None or s.kind is not ShardingKind.TILED or SubgroupKind.MANUAL not in s.subgroups:
            continue
        for callee in instr.called_computations():
            found.setdefault(callee, s)
    return found


def _exported_body_sharding(instr: Instruction, region: Sharding) -> None:
    """A sharding XLA's dump of a Shardy-lowered module writes on a value inside a manual body
    names only the free axes (`{mesh['a'=4,'b'=2], [{?}, {?}]}` in a body manual over 'b'): as
    the value's HLO sharding it would read "replicated over every device", not "one copy per
    manual group, split over the free axes", and the body would be computed whole along the
    free axes (a partially manual shard_map whose result is wanted tiled over 'a' then
    all-reduced 4x the bytes XLA does).  Made the body's own: the same split of the dims, the
    region's manual groups, the rest replicas, open dims kept, as JAX's GSPMD lowering writes it."""
    s, shape = instr.sharding, instr.shape
    if s is None or not s.named_mesh or s.is_tuple or not isinstance(shape, ArrayShape):
        return
    if s.kind is ShardingKind.TILED and SubgroupKind.MANUAL in s.subgroups:
        return
    local = _within_region(s, region, shape.rank)
    if local is not None:
        instr.sharding = local  # (keeps the open dims, which `_exported_open_dims` then marks)


def _exported_open_dims(instr: Instruction) -> None:
    """A `Sharding` custom-call whose named sharding leaves dims open (`{mesh[...], [{?},
    {'m', ?}]}`, as XLA's dump of a Shardy lowering writes a shard_map's operands): in the Shardy
    form those dims are open to propagation, as `unspecified_dims` says to GSPMD's (read closed,
    a batch tiled outside a partially manual shard_map was gathered into it and the body ran
    whole along it: 2-4x XLA's bytes or FLOPs).  Only in the Shardy form: XLA's GSPMD
    propagation takes such an annotation whole (golden/sharding-propagation/named_mesh_open_dims)."""
    s = instr.sharding
    if s is None or s.is_tuple or not s.open_dims or "backend_config" in instr.attributes:
        return
    _set_unspecified_dims(instr, s.open_dims)


def _drop_fully_open(instr: Instruction) -> None:
    """An op's named sharding that names no axis and leaves every dim open (`{mesh[...], [{?},
    {?}]}`, as XLA's dump of a Shardy lowering writes on the tuple of a jit's results) constrains
    nothing: Shardy's propagation fills it like an unannotated value.  Read as a fixed
    replicated sharding it stopped a result's tiling from reaching back into a shard_map body
    (the body then ran whole along a free axis: 4x XLA's FLOPs).  Entry parameters and roots
    keep theirs: there the sharding is the jit's signature."""
    s = instr.sharding
    if s is None or instr.opcode is Opcode.PARAMETER or instr.is_root:
        return
    shapes = _element_shapes(instr)
    elements = s.elements if s.is_tuple else (s,)
    if len(elements) == len(shapes) and all(_is_fully_open(e, shape) for e, shape in zip(elements, shapes)):
        instr.remove_attr("sharding")


def _is_fully_open(s: Sharding, shape: Shape) -> bool:
    rank = shape.rank if isinstance(shape, ArrayShape) else 0
    return (s.named_mesh and s.kind is ShardingKind.REPLICATED and rank > 0
            and tuple(s.open_dims) == tuple(range(rank)))


def _set_unspecified_dims(instr: Instruction, dims: Iterable[int]) -> None:
    """`backend_config="unspecified_dims=[...]"`: the dims an annotation leaves to propagation,
    as JAX's GSPMD lowering writes them (and sharding_propagation.unspecified_dims reads them)."""
    instr.set_attr("backend_config", quote("unspecified_dims=[" + ",".join(map(str, dims)) + "]"))


def _within_region(s: Sharding, region: Sharding, rank: int) -> Sharding | None:
    """`s` (a split of the dims over free axes, or replicated) on the devices of each of
    `region`'s manual groups: dims tiled as `s` tiles them, a MANUAL subgroup of the region's
    groups, the remaining devices replicas.  None when `s` is another kind, or its tiles do not
    give every manual group the same number of devices."""
    if s.kind is ShardingKind.REPLICATED:
        data: tuple[int, ...] = (1,) * rank
    elif s.kind is ShardingKind.TILED and s.data_rank == rank and set(s.subgroups) <= {SubgroupKind.REPLICATED}:
        data = s.data_tile_dims
    else:
        return None
    grid = region.tile_assignment
    assert grid is not None
    axis = region.data_rank + region.subgroups.index(SubgroupKind.MANUAL)
    groups = grid.shape[axis]
    n = grid.size
    if s.kind is ShardingKind.TILED and s.num_devices != n:
        return None
    coords = np.stack(np.unravel_index(np.arange(n), grid.shape), axis=1)
    group_of = dict(zip(grid.reshape(-1).tolist(), coords[:, axis].tolist()))
    members: dict[tuple[int, ...], list[int]] = {}
    for d in range(n):
        tile = s.tile_index(d) if s.kind is ShardingKind.TILED else (0,) * rank
        members.setdefault((*tile, group_of[d]), []).append(d)
    replicas = n // (int(np.prod(data)) * groups)
    if replicas < 1 or any(len(v) != replicas for v in members.values()):
        return None
    arr = np.empty((*data, groups, replicas), np.int64)
    for key, devs in members.items():
        arr[key] = devs
    if replicas == 1:
        out = Sharding.tiled(arr.reshape(*data, groups), (SubgroupKind.MANUAL,))
    else:
        out = Sharding.tiled(arr, (SubgroupKind.MANUAL, SubgroupKind.REPLICATED))
    return replace(out, open_dims=s.open_dims) if s.open_dims else out


def _region_axes(boundary: Instruction, enclosing: tuple[AxisRef, ...] = ()) -> tuple[AxisRef, ...]:
    """The manual axes inside the region a Global/LocalToGlobalShape `boundary` borders: those
    of the shard_map body it is nested in (`enclosing`), then its own."""
    own = read_manual_axes(_sdy_entry(boundary, "xla.sdy.manual_axes") or "#sdy<manual_axes{}>")
    return enclosing + tuple(a for a in own if a not in enclosing)


def _manual_axes_by_computation(module: Module) -> dict[Computation, tuple[AxisRef, ...]]:
    """Manual axes of each computation inside a shard_map body (callees of bodies included).
    A shard_map nested in another's body is manual over both regions' axes: callers are
    visited first, so the enclosing body's axes are known when its inner region is met."""
    found: dict[Computation, tuple[AxisRef, ...]] = {}
    for comp in module.computation_post_order()[::-1]:
        for instr in comp.instructions:
            target = instr.custom_call_target
            if target not in (GLOBAL_TO_LOCAL, LOCAL_TO_GLOBAL):
                continue
            axes = _region_axes(instr, found.get(comp, ()))
            if target == GLOBAL_TO_LOCAL:  # the body is the call that reads the region's inputs
                stack = list(instr.users)
                while stack:
                    user = stack.pop()
                    if user.opcode is Opcode.GET_TUPLE_ELEMENT:
                        stack.extend(user.users)
                    elif user.opcode is Opcode.CALL:
                        for callee in user.called_computations():
                            _mark(callee, axes, found)
            else:  # or the call whose results leave it: a region without inputs (axis_index) has only that
                for operand in instr.operands:
                    while operand.opcode in (Opcode.GET_TUPLE_ELEMENT, Opcode.TUPLE) and operand.operands:
                        operand = operand.operands[0]
                    if operand.opcode is Opcode.CALL:
                        for callee in operand.called_computations():
                            _mark(callee, axes, found)
    return found


def _mark(comp: Computation, axes: tuple[AxisRef, ...], found: dict[Computation, tuple[AxisRef, ...]]) -> None:
    if len(found.get(comp, ())) >= len(axes) and comp in found:
        return
    found[comp] = axes
    for instr in comp.instructions:
        for callee in instr.called_computations():
            _mark(callee, axes, found)


def _calls_manual_body(instr: Instruction, manual: dict[Computation, tuple[AxisRef, ...]]) -> bool:
    """A call of a shard_map body, or a get-tuple-element of one."""
    if instr.opcode is Opcode.GET_TUPLE_ELEMENT:
        instr = instr.operands[0]
    return instr.opcode is Opcode.CALL and any(c in manual for c in instr.called_computations())


def _drop_frontend_keys(instr: Instruction, keys: tuple[str, ...]) -> None:
    fe = _frontend(instr.attr)
    if fe is None:
        return
    entries = tuple((k, v) for k, v in fe.entries if k not in keys)
    if entries:
        instr.set_attr("frontend_attributes", FrontendAttributes(entries, fe.raw_value_keys))
    else:
        instr.remove_attr("frontend_attributes")


def _drop_sdy_frontend(get: Callable[..., Any], set_: Callable[[str, Any], Any],
                       remove: Callable[[str], Any]) -> None:
    fe = _frontend(get)
    if fe is None:
        return
    entries = tuple((k, v) for k, v in fe.entries if not k.startswith(SDY_PREFIX))
    if len(entries) == len(fe.entries):
        return
    if entries:
        set_("frontend_attributes", FrontendAttributes(entries, fe.raw_value_keys))
    else:
        remove("frontend_attributes")
