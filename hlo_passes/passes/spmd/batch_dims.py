"""Batch dims: the leading dims along which an op solves independent problems.

cholesky and triangular-solve factor and solve the matrices of their last two dims; every dim
before those is a batch dim.  fft transforms its `fft_length` trailing dims; the dims before
them are batch dims.  On CPU, JAX lowers linear algebra to LAPACK custom-calls
(`lapack_spotrf_ffi`, `lapack_strsm_ffi`, ...) that it registers with XLA as batch-partitionable
and marks `frontend_attributes={num_batch_dims="k"}`: the leading k dims of every operand and
every result are batch dims (XLA's CustomCallBatchPartitioner, which JAX installs for them).

    %c = (f32[16,32,32]{1,2,0}, s32[16]{0}) custom-call(%x), custom_call_target="lapack_spotrf_ffi",
         frontend_attributes={num_batch_dims="1"}
  batch dim 0 in the operand, in the factor and in the per-matrix status

Propagation (XLA's rule for those custom-calls, `infer_from_operands`) and the partitioner
(`handlers/batch_parallel.py`) read this module.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import ArrayShape, Shape, TupleShape
from hlo_passes.ir.sharding import Sharding, ShardingKind
from hlo_passes.passes.spmd import sharding_util as su

# The targets jaxlib 0.12.0.1 registers as batch-partitionable: `jaxlib.lapack
# .batch_partitionable_targets()` (its GPU solver modules register none in a CPU build).
# tests/spmd/test_batch_parallel.py checks this list against the installed jaxlib.
_ROUTINES = ("gees", "geev", "gehrd", "geqp3", "geqrf", "gesdd", "gesvd", "getrf", "gtsv", "potrf", "trsm")
_REAL_ROUTINES = ("orgqr", "ormqr", "syevd", "sytrd")        # s and d only
_COMPLEX_ROUTINES = ("ungqr", "unmqr", "heevd", "hetrd")     # c and z only
BATCH_PARTITIONABLE_TARGETS = frozenset(
    [f"lapack_{t}{r}_ffi" for t in "sdcz" for r in _ROUTINES]
    + [f"lapack_{t}{r}_ffi" for t in "sd" for r in _REAL_ROUTINES]
    + [f"lapack_{t}{r}_ffi" for t in "cz" for r in _COMPLEX_ROUTINES]
    + ["tridiagonal_solve_perturbed_ffi"])


def is_batch_partitionable_custom_call(instr: Instruction) -> bool:
    return (instr.opcode is Opcode.CUSTOM_CALL and instr.custom_call_target in BATCH_PARTITIONABLE_TARGETS
            and _custom_call_batch_dims(instr) is not None)


def num_batch_dims(instr: Instruction) -> int | None:
    """How many leading dims of every operand and result leaf are batch dims, or None when
    `instr` is not an op of that kind (or its shapes do not agree on them)."""
    op = instr.opcode
    if op in (Opcode.CHOLESKY, Opcode.TRIANGULAR_SOLVE):
        k = instr.array_shape.rank - 2
    elif op is Opcode.FFT:
        fft_length: tuple[int, ...] = instr.attr("fft_length") or ()
        k = instr.array_shape.rank - len(fft_length)
    elif op is Opcode.CUSTOM_CALL and instr.custom_call_target in BATCH_PARTITIONABLE_TARGETS:
        declared = _custom_call_batch_dims(instr)
        if declared is None:
            return None
        k = declared
    else:
        return None
    return k if k >= 0 and _leading_dims_agree(instr, k) else None


def _custom_call_batch_dims(instr: Instruction) -> int | None:
    text = instr.frontend_attributes.get("num_batch_dims")
    if text is None or not text.isascii() or not text.isdigit():
        return None
    return int(text)


def _leading_dims_agree(instr: Instruction, k: int) -> bool:
    """Every operand and result leaf is an array of rank >= k with the same k leading dims."""
    shape = instr.shape
    leaves: list[Shape] = [op.shape for op in instr.operands] + list(
        shape.elements if isinstance(shape, TupleShape) else (shape,))
    arrays = [s for s in leaves if isinstance(s, ArrayShape)]
    if not leaves or len(arrays) != len(leaves) or any(s.rank < k for s in arrays):
        return False
    return len({tuple(s.dims[:k]) for s in arrays}) == 1


def result_leaves(instr: Instruction) -> list[ArrayShape]:
    """The result's arrays: its shape, or a tuple's elements (all arrays where `num_batch_dims`
    found batch dims)."""
    shape = instr.shape
    leaves = list(shape.elements) if isinstance(shape, TupleShape) else [shape]
    arrays = [s for s in leaves if isinstance(s, ArrayShape)]
    if len(arrays) != len(leaves):
        raise TypeError(f"{instr.name}: expected array results, got {shape.to_hlo()}")
    return arrays


# ------------------------------------------------------------ shardings --
def batch_sharding(s: Sharding, rank: int, k: int) -> Sharding:
    """The tiling of the leading `k` dims of a rank-`rank` sharding, as a rank-k sharding: the
    other dims' devices become replicas (XLA's GetBatchSharding).  Replicated when nothing
    tiled is left, or when the value has no dims besides its batch dims."""
    if s.kind is not ShardingKind.TILED or k <= 0 or k >= rank:
        return su.replicated(s.metadata)
    core = range(k, rank)
    b = su.replicate_dims(s, core)
    return su.remove_dims(b, core) if b.kind is ShardingKind.TILED else b


def with_core_dims(s: Sharding, count: int) -> Sharding:
    """A rank-k batch sharding extended by `count` untiled dims (XLA's InsertNonBatchSharding)."""
    if s.kind is not ShardingKind.TILED or count < 0:
        return su.replicated(s.metadata)
    if count == 0:
        return s
    r = s.data_rank
    dims = list(s.tile_dims[:r]) + [1] * count + list(s.tile_dims[r:])
    return su.same_kind_subgroup(s, np.asarray(su.arr(s)).reshape(dims))


def infer_from_operands(instr: Instruction, operand_shardings: Sequence[Sharding | None]) -> Sharding | None:
    """The result sharding of a batch-partitionable custom-call from its operands' (XLA's
    CustomCallBatchPartitioner::InferShardingFromOperands): their batch tilings' common one,
    then every result leaf tiled on its batch dims only.  None when no operand has a sharding."""
    k = num_batch_dims(instr)
    if k is None or k <= 0:
        return None
    found = [batch_sharding(s, op.array_shape.rank, k) for op, s in zip(instr.operands, operand_shardings)
             if s is not None]
    if not found:
        return None
    common = found[0] if len(found) == 1 else su.find_common(found)
    if instr.shape.is_tuple:
        return Sharding.tuple_of([with_core_dims(common, e.rank - k) for e in result_leaves(instr)])
    return with_core_dims(common, instr.array_shape.rank - k)


__all__ = ["BATCH_PARTITIONABLE_TARGETS", "batch_sharding", "infer_from_operands", "is_batch_partitionable_custom_call",
           "num_batch_dims", "result_leaves", "with_core_dims"]
