"""Propagation rules for dot and convolution (registered into propagation_rules' tables).

Both are read as a dot: every dim of the result is a *batch* dim (in both operands), an lhs or
rhs *non-contracting* dim (in one operand), and the operands share *contracting* dims.  A
convolution whose spatial dims are all trivial (window 1, the kernel covering the input, or
XLA's encodings of a batch or rhs dim as a window) is such a dot (XLA's
dot_as_convolution_util); other convolutions are handled on their own.

Forward, each operand proposes the result sharding of its batch and non-contracting dims (its
contracting dims' devices become replicas).  When both proposals are acceptable, XLA looks
ahead along the chain of single users to the first sharded one and prefers the operand whose
proposal that user's sharding refines; else the larger operand's wins and the other merges in
where compatible.  Backward, an operand takes the result's tiling of its dims merged with the
other operand's tiling of the shared (batch, contracting) dims, so both sides of the
contraction agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hlo_passes.ir.attributes import ConvDimensionLabels, Window, WindowDimension
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.sharding import Sharding
from hlo_passes.passes.spmd import sharding_util as su
from hlo_passes.passes.spmd.propagation_rules import (FORWARD, FROM_USER, PropagationContext, agreeing_proposals,
                                                      is_spatial, known_sharding)


@dataclass(frozen=True)
class DimNums:
    lhs: int
    rhs: int
    output: int
    spatial: int = -1


@dataclass
class DotDims:
    """XLA's DotConvolutionDimsInfo: dims of (lhs, rhs, output); -1 where a side has none."""

    batch: list[DimNums] = field(default_factory=list)
    contracting: list[DimNums] = field(default_factory=list)
    lhs_non_contracting: list[DimNums] = field(default_factory=list)
    rhs_non_contracting: list[DimNums] = field(default_factory=list)
    conv_spatial: list[DimNums] = field(default_factory=list)

    def non_contracting(self, side: int) -> list[DimNums]:
        return self.lhs_non_contracting if side == 0 else self.rhs_non_contracting


def _side(d: DimNums, side: int) -> int:
    return d.lhs if side == 0 else d.rhs


def dot_dims(dot: Instruction) -> DotDims:
    dd = dot.dot_dimensions
    out = DotDims()
    for i, (l, r) in enumerate(zip(dd.lhs_batch, dd.rhs_batch)):
        out.batch.append(DimNums(l, r, i))
    for l, r in zip(dd.lhs_contracting, dd.rhs_contracting):
        out.contracting.append(DimNums(l, r, -1))
    nb = len(dd.lhs_batch)
    for i in range(dot.operands[0].array_shape.rank):
        if i not in dd.lhs_batch and i not in dd.lhs_contracting:
            out.lhs_non_contracting.append(DimNums(i, -1, nb + len(out.lhs_non_contracting)))
    nl = len(out.lhs_non_contracting)
    for i in range(dot.operands[1].array_shape.rank):
        if i not in dd.rhs_batch and i not in dd.rhs_contracting:
            out.rhs_non_contracting.append(DimNums(-1, i, nb + nl + len(out.rhs_non_contracting)))
    return out


def _spatial_is_batch(w: WindowDimension, lhs_size: int) -> bool:
    """XLA's encodings of a dot's batch dim as a convolution window."""
    if (lhs_size == w.size == w.lhs_dilation
            and ((max(1, lhs_size - 1) == w.stride and w.rhs_dilation == 1)
                 or (max(1, lhs_size - 1) == w.rhs_dilation and w.stride == 1))
            and w.padding_low == 0 and w.padding_high == 0 and not w.reversal):
        return True
    return (w.size == lhs_size and w.padding_high == lhs_size - 1 and w.padding_low == lhs_size - 1
            and w.reversal and w.rhs_dilation == 1 and w.stride == lhs_size and w.lhs_dilation == lhs_size - 1)


def conv_dims(conv: Instruction) -> DotDims:
    """A convolution read as a dot (XLA's ParseConvolutionDimsInfo)."""
    labels = _labels(conv)
    out = DotDims()
    out.lhs_non_contracting.append(DimNums(labels.input_batch, -1, labels.output_batch))
    out.rhs_non_contracting.append(DimNums(-1, labels.kernel_output_feature, labels.output_feature))
    out.contracting.append(DimNums(labels.input_feature, labels.kernel_input_feature, -1))
    window = _window(conv)
    lhs_shape, rhs_shape = conv.operands[0].array_shape, conv.operands[1].array_shape
    for i, (l, r, o) in enumerate(zip(labels.input_spatial, labels.kernel_spatial, labels.output_spatial)):
        ls, rs = lhs_shape.dims[l], rhs_shape.dims[r]
        w = window.dimensions[i]
        d = DimNums(l, r, o, i)
        if _spatial_is_batch(w, ls):
            out.batch.append(d)
        elif (ls == w.size and w.lhs_dilation == 1 and w.rhs_dilation == 1 and w.padding_high == 0
              and w.padding_low == 0 and not w.reversal):
            out.contracting.append(d)
        elif w.stride == 1 and w.rhs_dilation == 1 and w.lhs_dilation == 1:
            if rs == 1 and w.size == 1 and w.padding_high == 0 and w.padding_low == 0 and not w.reversal:
                out.lhs_non_contracting.append(d)
            elif (ls == 1 and w.size == rs and w.padding_high == rs - 1 and w.padding_low == rs - 1
                  and w.reversal):
                out.rhs_non_contracting.append(d)
            else:
                out.conv_spatial.append(d)
        else:
            out.conv_spatial.append(d)
    return out


def _from_operand(ctx: PropagationContext, instr: Instruction, dims: DotDims, side: int) -> Sharding | None:
    """The result sharding operand `side` proposes: its contracting dims replicated, its batch
    and non-contracting dims moved to the result's."""
    operand = instr.operands[side]
    s = known_sharding(ctx, operand)
    if su.is_tile_maximal(s):
        return s
    contracting = [_side(d, side) for d in dims.contracting]
    contracting += [_side(d, side) for d in dims.non_contracting(1 - side) if _side(d, side) >= 0]
    rep = su.replicate_dims(s, contracting)
    out_to_op = [-1] * instr.array_shape.rank
    op_to_out = [-1] * operand.array_shape.rank
    for d in dims.batch + dims.non_contracting(side):
        out_to_op[d.output] = _side(d, side)
        op_to_out[_side(d, side)] = d.output
    return su.transpose_collapsed(rep, op_to_out, out_to_op)


def infer_dot_from_operands(ctx: PropagationContext, instr: Instruction, dims: DotDims) -> bool:
    """XLA's InferDotShardingFromOperands (see the module docstring)."""
    offers = [(operand, _from_operand(ctx, instr, dims, side) if is_spatial(ctx, operand) else None)
              for side, operand in enumerate(instr.operands[:2])]
    proposals = [None if p is None else ctx.improved(p, instr)
                 for p in agreeing_proposals(ctx, instr.array_shape, offers)]
    a, b = proposals
    if a is None and b is None:
        return False
    if b is None or a is None:
        one = a if b is None else b
        assert one is not None  # (not both None: see above)
        ctx.set_sharding(instr, one)
        return True
    order = [a, b]
    decided = False
    ahead = ctx.lookahead_user_sharding(instr)
    if ahead is not None:
        a_fits = su.is_subtiling(instr.array_shape, ahead, a)
        b_fits = su.is_subtiling(instr.array_shape, ahead, b)
        if a_fits and not b_fits:
            decided = True
        elif b_fits and not a_fits:
            order = [b, a]
            decided = True
    if not decided and instr.operands[0].shape.byte_size() < instr.operands[1].shape.byte_size():
        order = [b, a]
    ctx.set_sharding(instr, order[0])
    ctx.improve(order[1], instr)
    return True


def operand_from_dot_user(ctx: PropagationContext, user: Instruction, dims: DotDims, side: int) -> Sharding | None:
    """XLA's InferDotOperandSharding: operand `side` of the dot `user`."""
    operand, other = user.operands[side], user.operands[1 - side]
    out_rep = [d.output for d in dims.non_contracting(1 - side)]
    other_rep = [_side(d, 1 - side) for d in dims.non_contracting(1 - side)]
    out_rep += [d.output for d in dims.contracting if d.output >= 0]
    other_rep += [_side(d, 1 - side) for d in dims.non_contracting(side) if _side(d, 1 - side) >= 0]
    out_s = su.replicate_dims(known_sharding(ctx, user), out_rep)
    out_to_op = [-1] * user.array_shape.rank
    op_to_out = [-1] * operand.array_shape.rank
    for d in dims.batch + dims.non_contracting(side):
        out_to_op[d.output] = _side(d, side)
        op_to_out[_side(d, side)] = d.output
    sharding = su.transpose_collapsed(out_s, out_to_op, op_to_out)
    if is_spatial(ctx, other):
        other_s = su.replicate_dims(known_sharding(ctx, other), other_rep)
        other_to_op = [-1] * other.array_shape.rank
        op_to_other = [-1] * operand.array_shape.rank
        for d in dims.batch + dims.contracting:
            other_to_op[_side(d, 1 - side)] = _side(d, side)
            op_to_other[_side(d, side)] = _side(d, 1 - side)
        from_other = su.transpose_collapsed(other_s, other_to_op, op_to_other)
        if sharding is not None and from_other is not None:
            better, merged = su.merge(sharding, from_other, ctx.may_combine)
            if better:
                sharding = merged
        elif sharding is None:
            sharding = from_other
    return sharding


def _dot_forward(ctx: PropagationContext, instr: Instruction) -> bool:
    return infer_dot_from_operands(ctx, instr, dot_dims(instr))


def _dot_backward(ctx: PropagationContext, instr: Instruction, user: Instruction) -> Sharding | None:
    return operand_from_dot_user(ctx, user, dot_dims(user), user.operands.index(instr))


def kernel_is_small(conv: Instruction) -> bool:
    """Smaller than the output along every spatial dim: then the output is split like the input."""
    labels = _labels(conv)
    rhs = conv.operands[1].array_shape
    kprod = oprod = 1
    for i, (k, o) in enumerate(zip(labels.kernel_spatial, labels.output_spatial)):
        kd, od = rhs.dims[k], conv.array_shape.dims[o]
        kprod *= kd
        oprod *= od
        if kd >= od and (i < 2 or kd > 3 or kprod >= oprod):
            return False
    return True


def _conv_forward(ctx: PropagationContext, instr: Instruction) -> bool:
    """As a dot when its spatial dims are trivial or unsplit; else like the input (small kernel,
    input feature unsplit) or split on the batch dim only (large kernel: a backward conv)."""
    dims = conv_dims(instr)

    def spatial_parts(operand: Instruction, side: int) -> int:
        s = ctx.sharding(operand)
        if s is None or su.is_tile_maximal(s) or s.kind.value != "tiled":
            return 1
        n = 1
        for d in dims.conv_spatial:
            n *= s.tile_dims[_side(d, side)]
        return n

    lhs, rhs = instr.operands
    if not dims.conv_spatial or (spatial_parts(lhs, 0) == 1 and spatial_parts(rhs, 1) == 1
                                 and instr.batch_group_count == 1 and instr.feature_group_count == 1):
        return infer_dot_from_operands(ctx, instr, dims)
    if not is_spatial(ctx, lhs):
        return False
    s = known_sharding(ctx, lhs)
    if su.is_tile_maximal(s):
        return ctx.improve(s, instr)
    labels = _labels(instr)
    if kernel_is_small(instr):
        if s.tile_dims[labels.input_feature] > 1 and not _tiles_whole_groups(ctx, instr, s, labels.input_feature):
            return False
        return ctx.improve(su.transpose(s, _output_to_input(instr)), instr)
    return ctx.improve(su.replicate_all_except(s, [labels.input_batch]), instr)


def _output_to_input(conv: Instruction) -> list[int]:
    """Each output dim's input dim (batch, feature and spatial dims in their order)."""
    labels = _labels(conv)
    out_to_lhs = [0] * conv.array_shape.rank
    out_to_lhs[labels.output_batch] = labels.input_batch
    out_to_lhs[labels.output_feature] = labels.input_feature
    for o, i in zip(labels.output_spatial, labels.input_spatial):
        out_to_lhs[o] = i
    return out_to_lhs


def _tiles_whole_groups(ctx: PropagationContext, conv: Instruction, s: Sharding, feature_dim: int) -> bool:
    """Is `conv` grouped (`feature_group_count` G > 1) and does `s` tile `feature_dim` (an input
    or output feature dim) in tiles of whole groups?  Then the groups are a dim the input
    features, the kernel's output features and the output features share, as Shardy's rule for
    a grouped convolution reads it (each device convolves its own groups), and the tiling
    passes between input and output features.  XLA's GSPMD rule propagates no tiled input
    feature dim, and a depthwise convolution of feature-tiled activations came out replicated
    and gathered; the rule applies in both forms (in the GSPMD form a depthwise gradient moves
    0 bytes where XLA's GSPMD plan gathers 16,384, at its FLOPs or fewer)."""
    groups = conv.feature_group_count
    return (groups > 1 and conv.batch_group_count == 1 and s.kind.value == "tiled"
            and groups % s.tile_dims[feature_dim] == 0)


def _conv_backward(ctx: PropagationContext, instr: Instruction, user: Instruction) -> Sharding | None:
    dims = conv_dims(user)
    if dims.conv_spatial:
        return _grouped_conv_operand(ctx, instr, user)
    return operand_from_dot_user(ctx, user, dims, user.operands.index(instr))


def _grouped_conv_operand(ctx: PropagationContext, instr: Instruction, conv: Instruction) -> Sharding | None:
    """A grouped convolution's input takes its output's sharding (feature tiles of whole
    groups), its kernel the output's feature tiling on the kernel's output features; None
    otherwise (XLA's GSPMD rule gives a spatial convolution's operands nothing)."""
    out = ctx.sharding(conv)
    labels = _labels(conv)
    if out is None or not _tiles_whole_groups(ctx, conv, out, labels.output_feature):
        return None
    if instr is conv.operands[0]:
        to_input = _output_to_input(conv)
        return su.transpose(out, [to_input.index(d) for d in range(instr.array_shape.rank)])
    kept = su.replicate_all_except(out, [labels.output_feature])
    if su.is_tile_maximal(kept):
        return None
    out_to_kernel = [-1] * conv.array_shape.rank
    kernel_to_out = [-1] * instr.array_shape.rank
    out_to_kernel[labels.output_feature] = labels.kernel_output_feature
    kernel_to_out[labels.kernel_output_feature] = labels.output_feature
    return su.transpose_collapsed(kept, out_to_kernel, kernel_to_out)


def _labels(conv: Instruction) -> ConvDimensionLabels:
    labels = conv.conv_labels
    assert labels is not None, f"{conv.name}: a convolution has dim_labels"
    return labels


def _window(conv: Instruction) -> Window:
    window = conv.window
    assert window is not None, f"{conv.name}: a convolution has a window"
    return window


FORWARD[Opcode.DOT] = _dot_forward
FORWARD[Opcode.CONVOLUTION] = _conv_forward
FROM_USER[Opcode.DOT] = _dot_backward
FROM_USER[Opcode.CONVOLUTION] = _conv_backward
