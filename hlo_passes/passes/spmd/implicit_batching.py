"""Index components that are an iota, made explicit batching dims before partitioning.

A gather (scatter) whose start indices are a concatenate along the index vector dim, one piece
of which is an iota along indices dim j, addresses operand dim o = start_index_map[k]
(scatter_dims_to_operand_dims[k]) at exactly position j: when o is collapsed (inserted) with a
window of 1 and as long as dim j, that is what an explicit batching pair (o, j) says.  The
partitioner then tiles o and j alike and runs the op locally (XLA's partitioner finds such
"parallel" dims the same way, from the iota, and subtracts each device's offset from that
index component instead).

    %i = s32[1,16,5] iota(), iota_dimension=1
    %idx = s32[2,16,5] concatenate(%i, %j), dimensions={0}
    %s = f32[16,6,3] scatter(%x, %idx, %u), inserted_window_dims={0,1},
         scatter_dims_to_operand_dims={0,1}, index_vector_dim=0, update_window_dims={2}
  becomes
    %s = f32[16,6,3] scatter(%x, s32[1,16,5] slice(%idx, [1:2]), %u), inserted_window_dims={1},
         scatter_dims_to_operand_dims={1}, input_batching_dims={0},
         scatter_indices_batching_dims={1}, index_vector_dim=0, update_window_dims={2}

When every component is such an iota, none remains: the indices become an empty slice along
the index vector dim (an index vector of no components; XLA parses, partitions and runs such a
gather or scatter, which reads the operand at the batch positions alone), the form of XLA's
partitioner tests of "parallel" gathers and scatters (indices a concatenate of iotas).  Not
when the indices are tiled along the index vector dim.  The new indices (slices of the old,
concatenated) take the old indices' sharding.
"""

from __future__ import annotations

from hlo_passes.ir.builder import Builder
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.sharding import ShardingKind


def make_iota_batching_explicit(module: Module) -> int:
    """Rewrite every gather and scatter of `module` as above; returns how many changed."""
    changed = 0
    for comp in list(module.computations):
        for instr in list(comp.instructions):
            if instr.opcode is Opcode.GATHER or instr.opcode is Opcode.SCATTER:
                changed += _rewrite(comp, instr)
    return changed


def _iota_components(indices: Instruction, ivd: int) -> dict[int, int]:
    """Index vector component -> the indices dim it is an iota along."""
    if indices.opcode is not Opcode.CONCATENATE or tuple(indices.dimensions) != (ivd,):
        return {}
    found: dict[int, int] = {}
    offset = 0
    for piece in indices.operands:
        width = piece.array_shape.dims[ivd]
        if piece.opcode is Opcode.IOTA and width == 1 and piece.iota_dimension != ivd:
            found[offset] = piece.iota_dimension
        offset += width
    return found


def _rewrite(comp: Computation, instr: Instruction) -> int:
    gather = instr.opcode is Opcode.GATHER
    if gather:
        gd = instr.gather_dimensions
        operand, indices = instr.operands
        ivd, index_map, windowless = gd.index_vector_dim, gd.start_index_map, gd.collapsed_slice_dims
        op_batching, idx_batching = gd.operand_batching_dims, gd.start_indices_batching_dims
        unit = {d for d, s in enumerate(gd.slice_sizes) if s == 1}
    else:
        sd = instr.scatter_dimensions
        n = (len(instr.operands) - 1) // 2
        operand, indices = instr.operands[0], instr.operands[n]
        ivd, index_map, windowless = sd.index_vector_dim, sd.scatter_dims_to_operand_dims, sd.inserted_window_dims
        op_batching, idx_batching = sd.input_batching_dims, sd.scatter_indices_batching_dims
        unit = set(windowless)  # an inserted window dim has size 1
    idx_dims = indices.array_shape.dims
    if ivd >= len(idx_dims):
        return 0
    pairs: list[tuple[int, int, int]] = []  # (component, operand dim, indices dim)
    used: set[int] = set()
    for k, j in sorted(_iota_components(indices, ivd).items()):
        o = index_map[k]
        if (o in windowless and o in unit and operand.array_shape.dims[o] == idx_dims[j]
                and j not in idx_batching and j not in used):
            pairs.append((k, o, j))
            used.add(j)
    if not pairs:
        return 0
    s = indices.sharding
    if s is not None and (s.is_tuple or (s.kind is ShardingKind.TILED and s.tile_dims[ivd] > 1)):
        return 0
    drop = {k for k, _, _ in pairs}
    keep = [k for k in range(len(index_map)) if k not in drop]
    b = Builder(comp, before=instr)
    pieces = []
    for k in keep or [0]:
        starts = [0] * len(idx_dims)
        limits = list(idx_dims)
        starts[ivd], limits[ivd] = k, k + 1 if keep else k  # (every component an iota: none left)
        pieces.append(b.slice(indices, starts, limits))
    new_idx = b.concatenate(pieces, ivd) if len(pieces) > 1 else pieces[0]
    if s is not None:
        for x in {id(p): p for p in [*pieces, new_idx]}.values():
            x.sharding = s
    instr.replace_operand(indices, new_idx)
    batching = sorted([*zip(op_batching, idx_batching), *((o, j) for _, o, j in pairs)])
    dropped_ops = {o for _, o, _ in pairs}
    names = (("operand_batching_dims", "start_indices_batching_dims", "collapsed_slice_dims", "start_index_map")
             if gather else
             ("input_batching_dims", "scatter_indices_batching_dims", "inserted_window_dims",
              "scatter_dims_to_operand_dims"))
    instr.set_attr(names[0], tuple(o for o, _ in batching))
    instr.set_attr(names[1], tuple(j for _, j in batching))
    instr.set_attr(names[2], tuple(d for d in windowless if d not in dropped_ops))
    instr.set_attr(names[3], tuple(index_map[k] for k in keep))
    return 1
