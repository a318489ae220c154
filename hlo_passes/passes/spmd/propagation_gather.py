"""Propagation rules for gather and scatter (registered into propagation_rules' tables).

Three kinds of dims connect a gather's operand, indices and result (a scatter's operands,
indices, updates and results the same way):

  passthrough   operand dims sliced whole <-> their offset (window) dims of the result;
  index         indices dims other than index_vector_dim <-> the result's batch dims;
  parallel      operand dims walked in step with an indices dim: explicit batching dims
                (`operand_batching_dims`), or an index that is an iota along some indices dim
                (XLA finds those through concatenates, copies and broadcasts of an iota).

Each rule moves tiles along one kind of connected dims and replicates every other dim, as
XLA's hlo_sharding_util does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import ArrayShape
from hlo_passes.ir.sharding import Sharding
from hlo_passes.ir.types import PrimitiveType
from hlo_passes.passes.spmd import sharding_util as su
from hlo_passes.passes.spmd.propagation_rules import (FORWARD, FROM_USER, PropagationContext, agreeing_proposals,
                                                      is_spatial, known_sharding)


@dataclass
class Connected:
    """Paired dims of the operand, the indices and the result/updates (XLA's GatherScatterDims)."""

    operand: list[int] = field(default_factory=list)
    indices: list[int] = field(default_factory=list)
    output: list[int] = field(default_factory=list)

    def extend(self, other: "Connected") -> None:
        self.operand += other.operand
        self.indices += other.indices
        self.output += other.output

    def fill_output(self, index_vector_dim: int, window_dims: Sequence[int]) -> None:
        """The result dim of each indices dim: batch dims in order, skipping window dims."""
        if not self.indices:
            return
        mapping: dict[int, int] = {}
        out = 0
        idx = 0
        while idx <= max(self.indices):
            if idx == index_vector_dim:
                idx += 1
            while out in window_dims:
                out += 1
            mapping[idx] = out
            idx += 1
            out += 1
        self.output = [mapping[i] for i in self.indices]


# ------------------------------------------------------------------ iotas --
def iota_dimension(instr: Instruction) -> int | None:
    """The dim along which `instr` counts 0, 1, 2, ... (an iota, an s32 constant that is one,
    or a broadcast of one), else None (XLA's GetDimensionForIota)."""
    if instr.opcode is Opcode.IOTA:
        dim: int = instr.attr("iota_dimension", 0)
        return dim
    if instr.array_shape.element_type is not PrimitiveType.S32:
        return None
    if instr.opcode is Opcode.CONSTANT:
        try:
            values = np.asarray(instr.literal_value())
        except Exception:  # noqa: BLE001 - an unreadable literal is no iota
            return None
        if values.ndim == 0:
            return None
        for d in range(values.ndim):
            if values.shape[d] > 1:
                ramp = np.arange(values.shape[d]).reshape([-1 if i == d else 1 for i in range(values.ndim)])
                if np.array_equal(values, np.broadcast_to(ramp, values.shape)):
                    return d
        return None
    if instr.opcode is Opcode.BROADCAST:
        inner = iota_dimension(instr.operands[0])
        return None if inner is None else instr.dimensions[inner]
    return None


def implicit_parallel_dims(operand: Instruction, indices: Instruction, slice_sizes: Sequence[int],
                           index_vector_dim: int, index_map: Sequence[int], indices_batching_dims: Sequence[int],
                           window_dims: Sequence[int]) -> Connected | None:
    """Operand dims indexed by an iota of some indices dim (XLA's GetGatherScatterBatchParallelDims)."""
    parallel_in = [-1] * len(index_map)
    source = indices
    while source.opcode is Opcode.COPY:
        source = source.operands[0]
    if source.opcode is not Opcode.CONCATENATE:
        source = indices
    if source.opcode is Opcode.CONCATENATE and source.dimensions[0] == index_vector_dim:
        done = 0
        for op in source.operands:
            count = op.array_shape.dims[index_vector_dim] if op.array_shape.rank > index_vector_dim else 1
            dim = iota_dimension(op)
            if dim is not None and dim != index_vector_dim:
                for j in range(count):
                    if done + j < len(parallel_in):
                        parallel_in[done + j] = dim
            done += count
    else:
        dim = iota_dimension(source)
        if dim is not None and dim != index_vector_dim:
            count = source.array_shape.dims[index_vector_dim] if source.array_shape.rank > index_vector_dim else 1
            parallel_in = [dim] * count
    result = Connected()
    for i, ind_dim in enumerate(parallel_in):
        if ind_dim == -1 or i >= len(index_map):
            continue
        op_dim = index_map[i]
        if ind_dim in result.indices:
            return None
        if slice_sizes[op_dim] == 1 and ind_dim not in indices_batching_dims:
            if operand.array_shape.dims[op_dim] != source.array_shape.dims[ind_dim]:
                return None
            result.indices.append(ind_dim)
            result.operand.append(op_dim)
    if not result.indices:
        return None
    result.fill_output(index_vector_dim, window_dims)
    return result


# ----------------------------------------------------------------- gather --
def gather_parallel_dims(gather: Instruction, explicit: bool = True) -> Connected | None:
    gd = gather.gather_dimensions
    result = Connected()
    if explicit and gd.operand_batching_dims:
        result.operand = list(gd.operand_batching_dims)
        result.indices = list(gd.start_indices_batching_dims)
        result.fill_output(gd.index_vector_dim, gd.offset_dims)
    implicit = implicit_parallel_dims(gather.operands[0], gather.operands[1], gd.slice_sizes, gd.index_vector_dim,
                                      gd.start_index_map, gd.start_indices_batching_dims, gd.offset_dims)
    if implicit is not None:
        result.extend(implicit)
    return result if result.operand else None


def _index_output_dims(indices_rank: int, index_vector_dim: int, output_rank: int,
                       window_dims: Sequence[int]) -> Connected:
    """Indices dims (all but index_vector_dim) <-> the result's non-window dims, in order."""
    out = Connected()
    idx = 0
    for o in range(output_rank):
        if o in window_dims:
            continue
        if idx == index_vector_dim:
            idx += 1
        out.indices.append(idx)
        out.output.append(o)
        idx += 1
    return out


def _passthrough(operand_shape: ArrayShape, collapsed: Sequence[int], batching: Sequence[int],
                 window_dims: Sequence[int], slice_sizes: Sequence[int]) -> Connected:
    """Operand dims sliced whole <-> their window dims."""
    out = Connected()
    skipped = 0
    for i in range(operand_shape.rank):
        if i in collapsed or i in batching:
            skipped += 1
            continue
        if slice_sizes[i] != operand_shape.dims[i]:
            continue
        out.operand.append(i)
        out.output.append(window_dims[i - skipped])
    return out


def _nontrivial(s: Sharding | None) -> Sharding | None:
    return None if s is None or su.is_tile_maximal(s) else s


def _explicit_batch_dims(operand_dims: Sequence[int], indices_dims: Sequence[int], index_vector_dim: int,
                         window_dims: Sequence[int]) -> Connected | None:
    if not operand_dims:
        return None
    result = Connected(list(operand_dims), list(indices_dims))
    result.fill_output(index_vector_dim, window_dims)
    return result


def _gather_forward(ctx: PropagationContext, instr: Instruction) -> bool:
    """In XLA's order (the first sharding a gather takes settles which later ones can refine
    it): explicit batching dims, the indices' batch dims, the dims an iota index walks in
    step, then the operand's dims sliced whole; in Shardy form, of two that want the same
    devices along different dims, the larger operand's (`agreeing_proposals`)."""
    gd = instr.gather_dimensions
    operand, indices = instr.operands
    rank = instr.array_shape.rank
    from_operand, from_indices = is_spatial(ctx, operand), is_spatial(ctx, indices)
    offers: list[tuple[Instruction, Sharding | None]] = []
    explicit = _explicit_batch_dims(gd.operand_batching_dims, gd.start_indices_batching_dims, gd.index_vector_dim,
                                    gd.offset_dims)
    parallel = gather_parallel_dims(instr, explicit=False)
    if explicit is not None and from_operand:
        offers.append((operand, su.along_dims(known_sharding(ctx, operand), explicit.operand, explicit.output, rank)))
    if explicit is not None and from_indices:
        offers.append((indices, su.along_dims(known_sharding(ctx, indices), explicit.indices, explicit.output, rank)))
    if from_indices:
        conn = _index_output_dims(indices.array_shape.rank, gd.index_vector_dim, rank, gd.offset_dims)
        offers.append((indices, su.along_dims(known_sharding(ctx, indices), conn.indices, conn.output, rank)))
    if parallel is not None and from_operand:
        offers.append((operand, su.along_dims(known_sharding(ctx, operand), parallel.operand, parallel.output, rank)))
    if parallel is not None and from_indices:
        offers.append((indices, su.along_dims(known_sharding(ctx, indices), parallel.indices, parallel.output, rank)))
    if from_operand:
        offers.append((operand, passthrough_sharding(instr, known_sharding(ctx, operand), parallel)))
    changed = False
    for proposal in agreeing_proposals(ctx, instr.array_shape, offers):
        if proposal is not None:
            changed |= ctx.improve(proposal, instr)
    return changed


def passthrough_sharding(gather: Instruction, operand_sharding: Sharding,
                         parallel: Connected | None = None) -> Sharding | None:
    """The result sharding a gather takes from its operand's dims sliced whole (an embedding
    lookup's feature dim), every other dim replicated; None when that tiles nothing."""
    gd = gather.gather_dimensions
    operand = gather.operands[0]
    s = su.replicate_dims(operand_sharding, parallel.operand if parallel else ())
    if s.kind.value != "tiled":
        return None
    conn = _passthrough(operand.array_shape, gd.collapsed_slice_dims, gd.operand_batching_dims, gd.offset_dims,
                        gd.slice_sizes)
    return _nontrivial(su.along_dims(s, conn.operand, conn.output, gather.array_shape.rank))


def _prefer_parallel(parallel: Sharding | None, passthrough: Sharding | None) -> Sharding | None:
    """XLA merges the parallel and passthrough proposals, preferring the parallel one."""
    if passthrough is None:
        return parallel
    if parallel is None:
        return passthrough
    better, merged = su.merge(parallel, passthrough, True)
    if better:
        return merged
    better, merged = su.merge(passthrough, parallel, True)
    return merged if better else parallel


def _gather_backward(ctx: PropagationContext, instr: Instruction, user: Instruction) -> Sharding | None:
    gd = user.gather_dimensions
    s = known_sharding(ctx, user)
    if instr is user.operands[1]:
        if su.is_tile_maximal(s) or su.is_manual(s):
            return s
        conn = _index_output_dims(instr.array_shape.rank, gd.index_vector_dim, user.array_shape.rank, gd.offset_dims)
        return su.along_dims(s, conn.output, conn.indices, instr.array_shape.rank)
    if su.is_tile_maximal(s) or su.is_manual(s):
        return s
    rank = instr.array_shape.rank
    parallel_dims = gather_parallel_dims(user)
    parallel = (su.along_dims(s, parallel_dims.output, parallel_dims.operand, rank)
                if parallel_dims is not None else None)
    conn = _passthrough(instr.array_shape, gd.collapsed_slice_dims, gd.operand_batching_dims, gd.offset_dims,
                        gd.slice_sizes)
    passthrough = _nontrivial(su.along_dims(s, conn.output, conn.operand, rank))
    return _prefer_parallel(parallel, passthrough)


# ---------------------------------------------------------------- scatter --
def _scatter_parts(scatter: Instruction) -> tuple[int, tuple[Instruction, ...], Instruction, tuple[Instruction, ...]]:
    n = (len(scatter.operands) - 1) // 2
    return n, scatter.operands[:n], scatter.operands[n], scatter.operands[n + 1:]


def _scatter_slice_sizes(scatter: Instruction) -> list[int]:
    sd = scatter.scatter_dimensions
    _, inputs, _, updates = _scatter_parts(scatter)
    operand, update = inputs[0].array_shape, updates[0].array_shape
    sizes = [1] * operand.rank
    k = 0
    for i in range(operand.rank):
        if i in sd.inserted_window_dims or i in sd.input_batching_dims:
            continue
        sizes[i] = update.dims[sd.update_window_dims[k]]
        k += 1
    return sizes


def scatter_parallel_dims(scatter: Instruction, explicit: bool = True) -> Connected | None:
    sd = scatter.scatter_dimensions
    _, inputs, indices, _ = _scatter_parts(scatter)
    result = Connected()
    if explicit and sd.input_batching_dims:
        result.operand = list(sd.input_batching_dims)
        result.indices = list(sd.scatter_indices_batching_dims)
        result.fill_output(sd.index_vector_dim, sd.update_window_dims)
    implicit = implicit_parallel_dims(inputs[0], indices, _scatter_slice_sizes(scatter), sd.index_vector_dim,
                                      sd.scatter_dims_to_operand_dims, sd.scatter_indices_batching_dims,
                                      sd.update_window_dims)
    if implicit is not None:
        result.extend(implicit)
    return result if result.operand else None


def _scatter_parallel(ctx: PropagationContext, instr: Instruction, parallel: Connected,
                      offers: list[list[tuple[Instruction, Sharding | None]]]) -> None:
    """Each result's offers along the parallel dims, from the operands', the indices' and the
    updates' ones."""
    n, inputs, indices, updates = _scatter_parts(instr)
    rank = inputs[0].array_shape.rank
    for i, operand in enumerate(inputs):
        if is_spatial(ctx, operand):
            offers[i].append((operand, su.along_dims(known_sharding(ctx, operand), parallel.operand, parallel.operand,
                                                     rank)))
    if is_spatial(ctx, indices):
        s = su.along_dims(known_sharding(ctx, indices), parallel.indices, parallel.operand, rank)
        for i in range(n):
            offers[i].append((indices, s))
    for i, update in enumerate(updates):
        if is_spatial(ctx, update):
            offers[i].append((update, su.along_dims(known_sharding(ctx, update), parallel.output, parallel.operand,
                                                    rank)))


def _scatter_forward(ctx: PropagationContext, instr: Instruction) -> bool:
    """In XLA's order: explicit batching dims, the operands whole, the dims an iota index walks
    in step, then the updates' window dims; in Shardy form, of two that want the same devices
    along different dims of one result, the larger operand's (`agreeing_proposals`)."""
    sd = instr.scatter_dimensions
    n, inputs, indices, updates = _scatter_parts(instr)
    rank = inputs[0].array_shape.rank
    offers: list[list[tuple[Instruction, Sharding | None]]] = [[] for _ in range(n)]
    explicit = _explicit_batch_dims(sd.input_batching_dims, sd.scatter_indices_batching_dims, sd.index_vector_dim,
                                    sd.update_window_dims)
    if explicit is not None:
        _scatter_parallel(ctx, instr, explicit, offers)
    for i, operand in enumerate(inputs):
        if is_spatial(ctx, operand):
            offers[i].append((operand, known_sharding(ctx, operand)))
    if is_spatial(ctx, indices) or any(is_spatial(ctx, u) for u in updates):
        parallel = scatter_parallel_dims(instr, explicit=False)
        if parallel is not None:
            _scatter_parallel(ctx, instr, parallel, offers)
        conn = _passthrough(inputs[0].array_shape, sd.inserted_window_dims, sd.input_batching_dims,
                            sd.update_window_dims, _scatter_slice_sizes(instr))
        for i, update in enumerate(updates):
            if is_spatial(ctx, update):
                s = known_sharding(ctx, update)
                offers[i].append((update, s if su.is_tile_maximal(s) or su.is_manual(s)
                                  else _nontrivial(su.along_dims(s, conn.output, conn.operand, rank))))
    changed = False
    for i in range(n):
        for proposal in agreeing_proposals(ctx, inputs[i].array_shape, offers[i]):
            if proposal is not None:
                changed |= ctx.improve_sub(proposal, instr, i)
    return changed


def _scatter_backward(ctx: PropagationContext, instr: Instruction, user: Instruction) -> Sharding | None:
    sd = user.scatter_dimensions
    n, inputs, indices, updates = _scatter_parts(user)
    us = known_sharding(ctx, user)
    if instr in inputs:
        return su.sub_sharding(user.shape, us, inputs.index(instr)) if user.shape.is_tuple else us
    update_rank = updates[0].array_shape.rank
    conn = _index_output_dims(indices.array_shape.rank, sd.index_vector_dim, update_rank, sd.update_window_dims)
    if instr is indices:
        found: list[Sharding] = []
        for u in updates:
            s = ctx.sharding(u)
            if s is not None and su.is_spatially_partitioned(s):
                found.append(s if su.is_tile_maximal(s) or su.is_manual(s)
                             else su.along_dims(s, conn.output, conn.indices, indices.array_shape.rank))
        return su.find_common(found) if found else None
    k = updates.index(instr)
    from_indices = su.replicated()
    if is_spatial(ctx, indices):
        s = known_sharding(ctx, indices)
        from_indices = s if su.is_tile_maximal(s) or su.is_manual(s) else su.along_dims(
            s, conn.indices, conn.output, update_rank)
    out_s = su.sub_sharding(user.shape, us, k) if user.shape.is_tuple else us
    from_output: Sharding | None = None
    if su.is_tile_maximal(out_s) or su.is_manual(out_s):
        from_output = out_s
    else:
        parallel_dims = scatter_parallel_dims(user)
        parallel = (su.along_dims(out_s, parallel_dims.operand, parallel_dims.output, update_rank)
                    if parallel_dims is not None else None)
        pconn = _passthrough(inputs[0].array_shape, sd.inserted_window_dims, sd.input_batching_dims,
                             sd.update_window_dims, _scatter_slice_sizes(user))
        passthrough = _nontrivial(su.along_dims(out_s, pconn.operand, pconn.output, update_rank))
        from_output = _prefer_parallel(parallel, passthrough)
    if from_output is not None:
        if not su.is_manual(from_output) and not su.is_manual(from_indices):
            merged = su.merge_if_compatible(from_indices, su.num_tiles(from_output) + 1, from_output)
            if merged is not None:
                from_output = merged
        if not su.is_tile_maximal(from_output):
            return from_output
    return None if su.is_tile_maximal(from_indices) else from_indices


FORWARD[Opcode.GATHER] = _gather_forward
FORWARD[Opcode.SCATTER] = _scatter_forward
FROM_USER[Opcode.GATHER] = _gather_backward
FROM_USER[Opcode.SCATTER] = _scatter_backward
