"""spmd-partition inside partially manual regions (shard_map with `axis_names`, `last_tile_dims={manual}`).

Each case is a hand-written GSPMD-form module on a 2x4 or 4x2 mesh with the manual axis major or
minor: the region's values are tiled over the automatic axis, and the partitioner must partition
them there (not gather them on the way in), keep every collective it inserts inside one manual
group, and give the unpartitioned program's values (checked numerically through XLA, which runs
the global module with its own partitioner).
"""

from __future__ import annotations

import numpy as np
import pytest

from hlo_passes import parse_module, print_module
from hlo_passes.ir import Opcode, Sharding, SubgroupKind
from hlo_passes.runtime import verify_equivalent
from hlo_passes.runtime.verify import strip_shardings
from tests.spmd.partitioning import partition as _partition

MESHES = [((2, 4), 0), ((2, 4), 1), ((4, 2), 0), ((4, 2), 1)]  # (mesh shape, manual axis)
MESH_IDS = ["2x4-manual-major", "2x4-manual-minor", "4x2-manual-major", "4x2-manual-minor"]


class Mesh:
    """A 2-axis mesh over devices 0..7 (row-major) with one manual and one automatic axis."""

    def __init__(self, shape: tuple[int, int], manual_axis: int):
        self.devices = np.arange(8).reshape(shape)
        self.manual_axis, self.auto_axis = manual_axis, 1 - manual_axis
        self.m, self.a = shape[manual_axis], shape[1 - manual_axis]

    def _by(self, first: int, second: int) -> np.ndarray:
        return self.devices.transpose(first, second)

    def region(self, rank: int, auto_dim: int | None) -> str:
        """Inside the region: `auto_dim` tiled over the automatic axis (None: whole per group)."""
        arr = self._by(self.auto_axis, self.manual_axis)  # [a, m]
        dims = [1] * rank
        if auto_dim is None:
            tile = arr.reshape(dims + [self.a, self.m]).transpose(
                list(range(rank)) + [rank + 1, rank])  # [..., m, a]: manual, then replicated
            return Sharding.tiled(tile, (SubgroupKind.MANUAL, SubgroupKind.REPLICATED)).to_hlo()
        dims[auto_dim] = self.a
        return Sharding.tiled(arr.reshape(dims + [self.m]), (SubgroupKind.MANUAL,)).to_hlo()

    def outside(self, rank: int, manual_dim: int | None, auto_dim: int | None) -> str:
        """Outside: `manual_dim` split over the manual axis (the groups' blocks), `auto_dim` over
        the automatic one (when both are the same dim, manual major)."""
        dims = [1] * rank
        used = []  # (dim, axis), in the order their tiles nest
        if manual_dim is not None:
            dims[manual_dim] *= self.m
            used.append((manual_dim, self.manual_axis))
        if auto_dim is not None:
            dims[auto_dim] *= self.a
            used.append((auto_dim, self.auto_axis))
        if not used:
            return "{replicated}"
        used.sort(key=lambda u: u[0])  # stable: manual first on a shared dim
        axes = [ax for _, ax in used]
        rest = [ax for ax in (0, 1) if ax not in axes]
        arr = self.devices.transpose(axes + rest)
        if rest:
            return Sharding.tiled(arr.reshape(dims + [arr.shape[-1]]), (SubgroupKind.REPLICATED,)).to_hlo()
        return Sharding.tiled(arr.reshape(dims)).to_hlo()

    def manual_group(self, device: int) -> int:
        return int(np.argwhere(self.devices == device)[0][self.manual_axis])

    def user_pairs(self) -> str:
        """Source-target pairs of a ppermute one step along the manual axis."""
        rows = self._by(self.auto_axis, self.manual_axis).tolist()
        pairs = [(row[i], row[(i + 1) % len(row)]) for row in rows for i in range(len(row))]
        return "{" + ",".join(f"{{{a},{b}}}" for a, b in pairs) + "}"

    def user_groups(self) -> str:
        """Replica groups of a psum over the manual axis: devices that differ only there."""
        groups = self._by(self.auto_axis, self.manual_axis).tolist()
        return "{" + ",".join("{" + ",".join(map(str, g)) + "}" for g in groups) + "}"


HEADER = """HloModule {name}, num_partitions=8

add {{
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT sum = f32[] add(x, y)
}}

"""


def _into_region(mesh: Mesh, name: str, param: int, global_dims, auto_dim, manual_dim=0) -> list[str]:
    rank = len(global_dims)
    local = list(global_dims)
    if manual_dim is not None:
        local[manual_dim] //= mesh.m
    outer = mesh.outside(rank, manual_dim, auto_dim)
    g = ",".join(map(str, global_dims))
    lo = ",".join(map(str, local))
    return [f"  {name}.g = f32[{g}] parameter({param}), sharding={outer}",
            f"  {name}.s = f32[{g}] custom-call({name}.g), custom_call_target=\"Sharding\", sharding={outer}",
            f"  {name} = f32[{lo}] custom-call({name}.s), custom_call_target=\"SPMDFullToShardShape\", "
            f"sharding={mesh.region(rank, auto_dim)}"]


def _out_of_region(mesh: Mesh, value: str, local_dims, region_auto_dim, manual_dim: int | None = 0) -> list[str]:
    rank = len(local_dims)
    full = list(local_dims)
    if manual_dim is not None:
        full[manual_dim] *= mesh.m
    lo, g = ",".join(map(str, local_dims)), ",".join(map(str, full))
    region = mesh.region(rank, region_auto_dim)
    outer = mesh.outside(rank, manual_dim, region_auto_dim)
    return [f"  out.s = f32[{lo}] custom-call({value}), custom_call_target=\"Sharding\", sharding={region}",
            f"  ROOT out = f32[{g}] custom-call(out.s), custom_call_target=\"SPMDShardToFullShape\", "
            f"sharding={outer}"]


def _module(name: str, lines: list[str]) -> str:
    return HEADER.format(name=name) + "ENTRY main {\n" + "\n".join(lines) + "\n}\n"


def elementwise(mesh: Mesh) -> str:
    r = mesh.region(2, 1)
    body = [f"  e = f32[8,32] exponential(x), sharding={r}",
            f"  m = f32[8,32] multiply(e, x), sharding={r}"]
    return _module("pm_elementwise", _into_region(mesh, "x", 0, (8 * mesh.m, 32), 1) + body
                   + _out_of_region(mesh, "m", (8, 32), 1))


def dot_contracting_on_auto(mesh: Mesh) -> str:
    """lhs [8,32] and rhs [32,16] tiled on the contracting dim over the automatic axis: a local
    dot of partial sums, all-reduced within each manual group."""
    whole = mesh.region(2, None)
    lines = (_into_region(mesh, "x", 0, (8 * mesh.m, 32), 1)
             + _into_region(mesh, "w", 1, (32, 16), 0, manual_dim=None))
    lines.append(f"  d = f32[8,16] dot(x, w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, "
                 f"sharding={whole}")
    return _module("pm_dot", lines + _out_of_region(mesh, "d", (8, 16), None))


def reduce_auto_dim(mesh: Mesh) -> str:
    whole = mesh.region(1, None)
    lines = _into_region(mesh, "x", 0, (8 * mesh.m, 32), 1)
    lines += [f"  zero = f32[] constant(0), sharding={mesh.region(0, None)}",
              f"  r = f32[8] reduce(x, zero), dimensions={{1}}, to_apply=add, sharding={whole}"]
    return _module("pm_reduce", lines + _out_of_region(mesh, "r", (8,), None))


def psum_and_gather_on_manual_axis(mesh: Mesh) -> str:
    """shard_map's own psum, all_gather and ppermute over the manual axis, on values tiled over
    the automatic axis (dim 1): they run on the tiles."""
    r = mesh.region(2, 1)
    groups = mesh.user_groups()
    lines = _into_region(mesh, "x", 0, (8 * mesh.m, 32), 1)
    lines += [f"  s = f32[8,32] all-reduce(x), channel_id=1, replica_groups={groups}, use_global_device_ids=true, "
              f"to_apply=add, sharding={r}",
              f"  g = f32[{8 * mesh.m},32] all-gather(s), channel_id=2, replica_groups={groups}, dimensions={{0}}, "
              f"use_global_device_ids=true, sharding={r}",
              f"  q = f32[{8 * mesh.m},32] collective-permute(g), channel_id=3, "
              f"source_target_pairs={mesh.user_pairs()}, sharding={r}",
              f"  t = f32[{8 * mesh.m},32] add(g, q), sharding={r}"]
    return _module("pm_collectives", lines + _out_of_region(mesh, "t", (8 * mesh.m, 32), 1))


def uneven_block(mesh: Mesh) -> str:
    """The region's dim 1 (15) is not cut evenly over the automatic axis: a padded region tile
    is no tile of the global array, so the input is gathered over the automatic axis on the way
    in (with a remark) and sliced; the ops inside still run on tiles."""
    r = mesh.region(2, 1)
    body = [f"  e = f32[8,15] exponential(x), sharding={r}"]
    return _module("pm_uneven", _into_region(mesh, "x", 0, (8 * mesh.m, 15), 1) + body
                   + _out_of_region(mesh, "e", (8, 15), 1))


def misannotated(mesh: Mesh, annotation: str) -> str:
    """A value inside the region annotated `annotation` (elementwise.m's, when it is the
    region's own sharding: the same program)."""
    r = mesh.region(2, 1)
    body = [f"  e = f32[8,32] exponential(x), sharding={r}",
            f"  m = f32[8,32] multiply(e, x), sharding={annotation}",
            f"  n = f32[8,32] add(m, e), sharding={r}"]
    return _module("pm_misannotated", _into_region(mesh, "x", 0, (8 * mesh.m, 32), 1) + body
                   + _out_of_region(mesh, "n", (8, 32), 1))


def _check(text: str, mesh: Mesh):
    module, out, remarks = _partition(text)
    report = verify_equivalent(text, out, num_devices=8)
    assert report.ok, report.format() + "\n" + out
    user = {i.name for i in parse_module(text).all_instructions() if i.opcode.is_collective}
    for instr in module.all_instructions():
        if not instr.opcode.is_collective or instr.name in user:
            continue
        if instr.opcode is Opcode.COLLECTIVE_PERMUTE:
            pairs = instr.attr("source_target_pairs")
        else:
            pairs = [(g[0], d) for g in instr.replica_groups.groups for d in g]
        for a, b in pairs:
            assert mesh.manual_group(a) == mesh.manual_group(b), f"{instr.name} crosses manual groups: {a}, {b}"
    return module, out, remarks


def _local_dims(module, name: str) -> tuple[int, ...]:
    (instr,) = [i for i in module.all_instructions() if i.name == name]
    return tuple(instr.shape.dims)


def _missed(remarks) -> list[str]:
    return [r.message for r in remarks if r.kind == "missed" and r.instruction]


@pytest.mark.parametrize("shape,manual", MESHES, ids=MESH_IDS)
def test_elementwise_computed_on_tiles(shape, manual):
    mesh = Mesh(shape, manual)
    module, _, remarks = _check(elementwise(mesh), mesh)
    assert _local_dims(module, "m") == (8, 32 // mesh.a)
    assert not any(i.opcode.is_collective for i in module.all_instructions())
    assert not _missed(remarks)


@pytest.mark.parametrize("shape,manual", MESHES, ids=MESH_IDS)
def test_dot_contracting_dim_on_the_automatic_axis_all_reduces_within_each_manual_group(shape, manual):
    mesh = Mesh(shape, manual)
    module, _, remarks = _check(dot_contracting_on_auto(mesh), mesh)
    (ar,) = [i for i in module.all_instructions() if i.opcode is Opcode.ALL_REDUCE]
    assert tuple(ar.shape.dims) == (8, 16)
    assert sorted(len(g) for g in ar.replica_groups.groups) == [mesh.a] * mesh.m
    assert not any(i.opcode is Opcode.ALL_GATHER for i in module.all_instructions())
    assert not _missed(remarks)


@pytest.mark.parametrize("shape,manual", MESHES, ids=MESH_IDS)
def test_reduce_over_the_automatic_axis_all_reduces_within_each_manual_group(shape, manual):
    mesh = Mesh(shape, manual)
    module, _, remarks = _check(reduce_auto_dim(mesh), mesh)
    (ar,) = [i for i in module.all_instructions() if i.opcode is Opcode.ALL_REDUCE]
    assert tuple(ar.shape.dims) == (8,)
    assert sorted(len(g) for g in ar.replica_groups.groups) == [mesh.a] * mesh.m
    assert not _missed(remarks)


@pytest.mark.parametrize("shape,manual", MESHES, ids=MESH_IDS)
def test_shard_map_collectives_on_the_manual_axis_run_on_tiles(shape, manual):
    mesh = Mesh(shape, manual)
    module, _, remarks = _check(psum_and_gather_on_manual_axis(mesh), mesh)
    assert _local_dims(module, "s") == (8, 32 // mesh.a)
    assert _local_dims(module, "g") == (8 * mesh.m, 32 // mesh.a)
    kinds = sorted(i.opcode.value for i in module.all_instructions() if i.opcode.is_collective)
    assert _local_dims(module, "q") == (8 * mesh.m, 32 // mesh.a)
    assert kinds == ["all-gather", "all-reduce", "collective-permute"]  # the program's own, nothing inserted
    assert not _missed(remarks)


@pytest.mark.parametrize("shape,manual", MESHES, ids=MESH_IDS)
def test_region_input_not_cut_evenly_is_gathered_on_the_way_in(shape, manual):
    mesh = Mesh(shape, manual)
    module, _, remarks = _check(uneven_block(mesh), mesh)
    assert _local_dims(module, "e") == (8, -(-15 // mesh.a))
    assert any("gathered over its automatic axes" in m for m in _missed(remarks))


@pytest.mark.parametrize("shape,manual", MESHES, ids=MESH_IDS)
def test_handler_leaving_the_manual_groups_is_undone_and_computed_whole_per_group(shape, manual):
    """An op inside the region annotated with a tiling over all 8 devices (no manual groups):
    there is no resharding into it, so what its handler emitted is taken back and the op runs
    on its operands gathered over the automatic axis, with a remark; the program still computes
    what the same program annotated consistently computes."""
    mesh = Mesh(shape, manual)
    text = misannotated(mesh, "{devices=[1,8]<=[8]}")
    module, out, remarks = _partition(text)
    report = verify_equivalent(misannotated(mesh, mesh.region(2, 1)), out, num_devices=8)
    assert report.ok, report.format() + "\n" + out
    assert _local_dims(module, "m") == (8, 32)
    assert _local_dims(module, "n") == (8, 32 // mesh.a)
    assert any(m.startswith("replicated: computed whole per manual group") for m in _missed(remarks))


# Found by the random differential tests (fifth round, dense seed 7224) and judged WRONG there,
# against XLA's own partitioner, the only oracle that runs partially manual modules: a region
# manual over one axis of a [4,2] mesh reduces each manual group's column to one element, beside
# a select-and-scatter whose output the module also returns.
SEED_7224 = """
HloModule random, num_partitions=8

r_add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}

select_le {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = pred[] compare(a, b), direction=LE
}

ENTRY main {
  p0 = f32[1] parameter(0), sharding={replicated}
  p1 = f32[1,2,4] parameter(1), sharding={devices=[4,2,1]0,1,2,3,4,5,6,7}
  p2 = f32[12,2] parameter(2), sharding={devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}
  zero.1 = f32[] constant(0)
  pool_grad.2 = f32[12,2] select-and-scatter(p2, p2, zero.1), window={size=3x1 stride=1x1 pad=0_2x0_0}, select=select_le, scatter=r_add
  add.3 = f32[12,2] add(p2, pool_grad.2)
  on_a.4 = f32[12,2] custom-call(add.3), custom_call_target="Sharding", sharding={devices=[8,1]0,1,2,3,4,5,6,7}
  on_b.5 = f32[12,2] custom-call(on_a.4), custom_call_target="Sharding", sharding={devices=[1,8]0,1,2,3,4,5,6,7}
  cosine.6 = f32[12,2] floor(on_b.5)
  convert.7 = s32[12,2] convert(pool_grad.2)
  convert.8 = f32[12,2] convert(convert.7)
  enter.9 = f32[12,2] custom-call(pool_grad.2), custom_call_target="Sharding", sharding={devices=[4,2]0,4,1,5,2,6,3,7}
  region.10 = f32[12,1] custom-call(enter.9), custom_call_target="SPMDFullToShardShape", sharding={devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dims={manual}}
  zero.12 = f32[] constant(0), sharding={devices=[2,4]0,1,2,3,4,5,6,7 last_tile_dims={manual, replicated}}
  pm_reduced.13 = f32[1] reduce(region.10, zero.12), dimensions={0}, to_apply=r_add, sharding={devices=[1,2,4]0,1,2,3,4,5,6,7 last_tile_dims={manual, replicated}}
  pm_reduce.11 = f32[12,1] broadcast(pm_reduced.13), dimensions={1}, sharding={devices=[1,1,2,4]0,1,2,3,4,5,6,7 last_tile_dims={manual, replicated}}
  zero.15 = f32[] constant(0), sharding={devices=[2,4]0,1,2,3,4,5,6,7 last_tile_dims={manual, replicated}}
  pm_reduced.16 = f32[12] reduce(pm_reduce.11, zero.15), dimensions={1}, to_apply=r_add, sharding={devices=[4,2]0,4,1,5,2,6,3,7 last_tile_dims={manual}}
  pm_reduce.14 = f32[12,1] broadcast(pm_reduced.16), dimensions={0}, sharding={devices=[1,1,2,4]0,1,2,3,4,5,6,7 last_tile_dims={manual, replicated}}
  pm_binary.17 = f32[12,1] multiply(pm_reduce.14, pm_reduce.14), sharding={devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dims={manual}}
  leave.18 = f32[12,1] custom-call(pm_binary.17), custom_call_target="Sharding", sharding={devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dims={manual}}
  full.19 = f32[12,2] custom-call(leave.18), custom_call_target="SPMDShardToFullShape", sharding={devices=[4,2]0,4,1,5,2,6,3,7}
  ROOT out = (f32[12,2], f32[12,2], f32[12,2], f32[1,2,4]) tuple(full.19, convert.8, cosine.6, p1), sharding={{devices=[2,4]1,3,4,2,6,0,5,7}, {devices=[8,1]0,5,3,4,2,7,1,6}, {devices=[4,2]0,1,2,3,4,5,6,7}, {devices=[2,2,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}}
}
"""

# What the region computes, by hand: each manual group holds one column j of pool_grad.2 as
# [12,1]; the first reduce sums it to f32[1], the broadcast and second reduce leave that sum on
# every row, the multiply squares it, so column j of the result is (sum_i pool_grad[i,j])^2.
SEED_7224_REGION_BY_HAND = """  colsum = f32[2] reduce(pool_grad.2, zero.1), dimensions={0}, to_apply=r_add
  sq = f32[2] multiply(colsum, colsum)
  full.19 = f32[12,2] broadcast(sq), dimensions={1}"""


SEED_9004 = """
HloModule random, num_partitions=8

r_add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}

r_maximum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] maximum(a, b)
}

ENTRY main {
  p0 = f32[1,5] parameter(0), sharding={devices=[2,1,4]7,1,4,6,5,0,3,2 last_tile_dim_replicate}
  p1 = f32[16] parameter(1), sharding={devices=[8]0,1,2,3,4,5,6,7}
  p2 = f32[1,8] parameter(2), sharding={devices=[1,4,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}
  p3 = f32[3,12,3,3] parameter(3), sharding={devices=[2,1,4,1]7,0,5,6,1,3,2,4}
  p4 = f32[3,12,3,1] parameter(4), sharding={devices=[2,1,4,1]0,1,2,3,4,5,6,7}
  topk.1 = (f32[1], s32[1]) topk(p1), k=1, largest=false
  top.2 = f32[1] get-tuple-element(topk.1), index=0
  where.3 = s32[1] get-tuple-element(topk.1), index=1
  where.4 = f32[1] convert(where.3)
  init.5 = f32[] constant(-inf)
  reduce-window.6 = f32[1] reduce-window(top.2, init.5), window={size=1 stride=1 pad=0_0}, to_apply=r_maximum
  dot.7 = f32[8] dot(top.2, p2), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  i.8 = s32[] constant(1)
  dynamic-slice.9 = f32[1] dynamic-slice(reduce-window.6, i.8), dynamic_slice_sizes={1}
  row.10 = s32[3,12,3,3] iota(), iota_dimension=2
  col.11 = s32[3,12,3,3] iota(), iota_dimension=3
  diag.12 = pred[3,12,3,3] compare(row.10, col.11), direction=EQ
  big.13 = f32[3,12,3,3] broadcast(f32[] constant(6)), dimensions={}
  zero.14 = f32[3,12,3,3] broadcast(f32[] constant(0)), dimensions={}
  d.15 = f32[3,12,3,3] select(diag.12, big.13, zero.14)
  spd.16 = f32[3,12,3,3] add(p3, d.15)
  solve.17 = f32[3,12,3,1] triangular-solve(spd.16, p4), left_side=true, lower=true, transpose_a=NO_TRANSPOSE
  idx.18 = s32[1,1] constant({{1}})
  scatter.19 = f32[1,5] scatter(p0, idx.18, p0), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=r_maximum, sharding={devices=[2,4]7,4,2,6,5,1,0,3}
  enter.20 = f32[3,12,3,3] custom-call(p3), custom_call_target="Sharding", sharding={devices=[1,4,1,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}
  region.21 = f32[3,3,3,3] custom-call(enter.20), custom_call_target="SPMDFullToShardShape", sharding={devices=[1,1,1,1,4,2]0,1,2,3,4,5,6,7 last_tile_dims={manual, replicated}}
  pm_psum.22 = f32[3,3,3,3] all-reduce(region.21), channel_id=1, replica_groups={{0,2,4,6},{1,3,5,7}}, use_global_device_ids=true, to_apply=r_add, sharding={devices=[1,1,1,1,4,2]0,1,2,3,4,5,6,7 last_tile_dims={manual, replicated}}
  pm_psum.23 = f32[3,3,3,3] all-reduce(pm_psum.22), channel_id=1, replica_groups={{0,2,4,6},{1,3,5,7}}, use_global_device_ids=true, to_apply=r_add, sharding={devices=[1,1,1,1,4,2]0,1,2,3,4,5,6,7 last_tile_dims={manual, replicated}}
  zero.25 = f32[] constant(0), sharding={devices=[4,2]0,1,2,3,4,5,6,7 last_tile_dims={manual, replicated}}
  pm_reduced.26 = f32[3,3,3] reduce(pm_psum.23, zero.25), dimensions={0}, to_apply=r_add, sharding={devices=[1,1,1,4,2]0,1,2,3,4,5,6,7 last_tile_dims={manual, replicated}}
  pm_reduce.24 = f32[3,3,3,3] broadcast(pm_reduced.26), dimensions={1,2,3}, sharding={devices=[1,1,1,1,4,2]0,1,2,3,4,5,6,7 last_tile_dims={manual, replicated}}
  leave.27 = f32[3,3,3,3] custom-call(pm_reduce.24), custom_call_target="Sharding", sharding={devices=[1,1,1,1,4,2]0,1,2,3,4,5,6,7 last_tile_dims={manual, replicated}}
  full.28 = f32[3,12,3,3] custom-call(leave.27), custom_call_target="SPMDShardToFullShape", sharding={devices=[1,4,1,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}
  ROOT out = (f32[3,12,3,3], f32[1,5], f32[3,12,3,1], f32[1]) tuple(full.28, scatter.19, solve.17, dynamic-slice.9), sharding={{devices=[2,1,4,1]5,7,2,3,0,6,1,4}, {devices=[1,4,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}, {devices=[2,2,1,2]4,3,6,0,2,1,5,7}, {devices=[8]3,1,4,2,0,7,5,6}}
}
"""

# Seed 9004's region, by hand: manual group k holds B_k = p3[:, 3k:3k+3]; the first psum (over
# one device of each group) is S = B_0 + ... + B_3, the second sums that alike value: 4S; the
# reduce over dim 0 and its broadcast give R = sum over dim 0 of 4S on every row; leaving the
# region puts R in every group's place.
SEED_9004_REGION_BY_HAND = """  b0 = f32[3,3,3,3] slice(p3), slice={[0:3], [0:3], [0:3], [0:3]}
  b1 = f32[3,3,3,3] slice(p3), slice={[0:3], [3:6], [0:3], [0:3]}
  b2 = f32[3,3,3,3] slice(p3), slice={[0:3], [6:9], [0:3], [0:3]}
  b3 = f32[3,3,3,3] slice(p3), slice={[0:3], [9:12], [0:3], [0:3]}
  s01 = f32[3,3,3,3] add(b0, b1)
  s23 = f32[3,3,3,3] add(b2, b3)
  sum = f32[3,3,3,3] add(s01, s23)
  four = f32[3,3,3,3] broadcast(f32[] constant(4)), dimensions={}
  sum4 = f32[3,3,3,3] multiply(sum, four)
  zero.25 = f32[] constant(0)
  rows = f32[3,3,3] reduce(sum4, zero.25), dimensions={0}, to_apply=r_add
  r = f32[3,3,3,3] broadcast(rows), dimensions={1,2,3}
  full.28 = f32[3,12,3,3] concatenate(r, r, r, r), dimensions={1}"""


def _region_by_hand(module: str, first: str, last: str, by_hand: str) -> str:
    """`module` with the lines from `first` to `last` (entering and leaving its region) replaced
    by `by_hand`, and its shardings stripped: the plain program it means."""
    lines = module.split("\n")
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith(first))
    end = next(i for i, ln in enumerate(lines) if ln.strip().startswith(last))
    text = print_module(strip_shardings(parse_module("\n".join(lines[:start] + [by_hand] + lines[end + 1:]))))
    assert "SPMDFullToShardShape" not in text and "sharding=" not in text
    return text


@pytest.mark.parametrize("module, first, last, by_hand", [
    # Seed 7224 (fifth fuzz round).  XLA's partitioner gets the region's reduce to one element
    # wrong in every element (as its reduce to a scalar inside a region, README's Limits), so the
    # generator no longer draws one (random_hlo.op_partially_manual); two of its outputs outside
    # the region, a truncating convert and a floor of the select-and-scatter, also differ in one
    # to three elements by 1, where ours equal the plain program exactly (not pursued further).
    (SEED_7224, "enter.9", "full.19", SEED_7224_REGION_BY_HAND),
    # Seed 9004 (the review's fuzz run).  XLA's partitioner zeroes three elements of a max-scatter
    # whose only index (1) is out of range for its operand's size-1 dim, an update the scatter
    # must skip (ours returns the operand); alone, without the region, it partitions that scatter
    # right, so only modules with a region meet it; the generator was left as it is.
    (SEED_9004, "enter.20", "full.28", SEED_9004_REGION_BY_HAND),
], ids=["seed7224", "seed9004"])
def test_module_with_a_region_matches_the_program_derived_by_hand(module, first, last, by_hand):
    """Modules the random differential tests judged WRONG against XLA's own partitioner, the only
    oracle that runs partially manual regions: our partition equals, output for output, the
    unsharded program whose region is replaced by what it computes (derived by hand above), on
    three input draws (sums to within an ulp: another summation order)."""
    plain = _region_by_hand(module, first, last, by_hand)
    _, out, _ = _partition(module, 8)
    for seed in (0, 1, 2):
        report = verify_equivalent(plain, out, num_devices=8, seed=seed)
        assert report.ok, report.format()
