"""spmd-partition: the output contract, hand-derived collectives on real JAX programs, and every
annotated corpus program (both Shardy and GSPMD input forms) verified on 8 devices against the
unpartitioned module.  Unannotated corpus programs are sharded on their float parameters' dim 0
(often unevenly) to drive every handler, and must still verify."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from hlo_passes import parse_module, print_module
from hlo_passes.ir import Opcode, Sharding, SubgroupKind
from hlo_passes.passes.registry import lookup
from hlo_passes.passes.spmd.spmd_partitioner import SpmdPartitioner
from hlo_passes.runtime import verify_equivalent
from hlo_passes.runtime.xla_backend import pass_dump
from tests.spmd.partitioning import collectives

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "golden" / "corpus"
# Every corpus program XLA partitioned itself (kept beside it as .xla_spmd.hlo).
XLA_PARTITIONED = sorted(p.parent.name for p in CORPUS.glob("*/*.xla_spmd.hlo"))
UNANNOTATED = ["cond_switch", "convnet_bn", "gather_scatter", "mlp_train_step", "moe_layer", "scan_while",
               "sort_topk", "transformer_block"]


def partition(text: str, n: int = 8):
    module = parse_module(text)
    p = SpmdPartitioner(num_partitions=n)
    assert p.run(module)
    return module, print_module(module), p.remarks


def test_registered_with_num_partitions_cleanup_and_cost_profile_options():
    cls = lookup("spmd-partition")
    assert cls is SpmdPartitioner
    assert [f.name for f in cls.option_fields()] == ["num_partitions", "cleanup", "cost_profile"]


def test_ends_with_cse_like_xla_so_twin_psums_become_one_all_reduce():
    """XLA's partitioner ends with a layout-insensitive CSE; its partitioned pmap_collectives
    has two all-reduces where JAX emitted three (two psums of one value, each with its own
    reducer computation).  `cleanup=false` leaves the partitioner's raw output."""
    text = (CORPUS / "pmap_collectives" / "pmap_collectives.lowered.shardy.hlo").read_text()
    xla = parse_module((CORPUS / "pmap_collectives" / "pmap_collectives.xla_spmd.hlo").read_text())
    raw, cleaned = parse_module(text), parse_module(text)
    SpmdPartitioner(num_partitions=8, cleanup=False).run(raw)
    SpmdPartitioner(num_partitions=8).run(cleaned)
    assert collectives(raw)["all-reduce"] == 3
    assert collectives(cleaned) == collectives(xla)


def lowered(program: str, form: str) -> str:
    """A corpus program's lowered text with the propagation flags JAX compiled it with (see
    benchmarks/spmd_quality.lowered_as_compiled)."""
    return _spmd_quality().lowered_as_compiled(CORPUS / program, program, form)


def _meta(program: str) -> dict:
    return json.loads((CORPUS / program / "meta.json").read_text())


def _has_manual_region(program: str) -> bool:
    meta = _meta(program)
    return meta.get("kind") in ("shard_map", "pmap") or meta.get("transform") == "pmap"


def _spmd_quality():
    spec = importlib.util.spec_from_file_location("spmd_quality", REPO / "benchmarks" / "spmd_quality.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("form", ["shardy", "gspmd"])
@pytest.mark.parametrize("program", XLA_PARTITIONED)
def test_sharded_corpus_program_verifies(program, form):
    """Global-view programs are run against the unpartitioned module at their own device count;
    programs with manual regions (shard_map, pmap) cannot run unpartitioned, so they are compared
    device by device with XLA's partitioned program."""
    text = lowered(program, form)
    n = _meta(program)["num_devices"]
    module, out, remarks = partition(text, n)
    assert module.num_partitions == n
    if _has_manual_region(program):
        xla = (CORPUS / program / f"{program}.xla_spmd.hlo").read_text()
        ok, note = _spmd_quality().compare_with_xla(out, xla, n)
        assert ok, note
    else:
        report = verify_equivalent(text, out, num_devices=n)
        assert report.ok, report.format()
    for r in remarks:
        if r.kind == "missed" and r.instruction:
            assert r.message.startswith("replicated: ")


def test_shard_map_2d_partially_manual_region_partitioned_over_y_like_xla():
    """The partially manual region (manual 'x') takes its input's split over 'y' through its
    open dims, is partitioned over 'y' (its psum over 'x' sums [4,4] tiles, within each y
    column) and, as XLA compiled it with allow_spmd_sharding_propagation_to_output, its result
    stays tiled over 'y': XLA's bytes, XLA's per-device values."""
    program = "shard_map_collectives_2d"
    module, out, _ = partition(lowered(program, "shardy"))
    assert module.entry.root.sharding.element(2).to_hlo() == "{devices=[1,2,4]<=[4,2]T(1,0) last_tile_dim_replicate}"
    body = next(c for c in module.computations if c.name.startswith("xla.sdy.manual_computation_body_0"))
    (psum,) = [i for i in body.instructions if i.opcode is Opcode.ALL_REDUCE]
    assert psum.shape.dims == (4, 4) and [list(g) for g in psum.replica_groups.groups] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert not any(i.opcode is Opcode.ALL_GATHER for i in body.instructions)
    xla = (CORPUS / program / f"{program}.xla_spmd.hlo").read_text()
    ok, note = _spmd_quality().compare_with_xla(out, xla, 8)
    assert ok and not note, note


def test_megatron_output_contract_and_collectives():
    """Layer 1: rows over 4, w1 columns over 2 -> local.  Layer 2: contracting dim over 2 ->
    one all-reduce in pairs {0,1},{2,3},... (the same as XLA's partitioner)."""
    text = lowered("sharded_megatron_mlp", "shardy")
    module, out, _ = partition(text)
    assert module.num_partitions == 8
    assert collectives(module) == {"all-reduce": 1}
    (ar,) = [i for i in module.all_instructions() if i.opcode is Opcode.ALL_REDUCE]
    assert [tuple(g) for g in ar.attr("replica_groups").groups] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert ar.attr("use_global_device_ids") is True
    x, w1, w2 = module.entry.parameters
    assert [p.shape.dims for p in (x, w1, w2)] == [(4, 32), (32, 32), (32, 32)]
    assert x.sharding == Sharding.tiled(np.arange(8).reshape(4, 1, 2), (SubgroupKind.REPLICATED,))
    assert module.entry.root.sharding == x.sharding  # the result keeps its logical sharding
    assert "custom_call_target=\"Sharding\"" not in out and "sdy" not in out
    assert "entry_computation_layout" not in out
    from jax._src.lib import xla_client as xc

    xc.hlo.hlo_module_from_text(out)  # XLA's parser accepts it


def test_fsdp_gathers_the_weight_once():
    """x rows over 8, w rows over 8 with a replicated constraint: one all-gather of w, then the
    tanh/reduce over the sharded batch dim sums with one all-reduce."""
    text = (CORPUS / "sharded_fsdp" / "sharded_fsdp.lowered.gspmd.hlo").read_text()
    module, _, _ = partition(text)
    assert collectives(module) == {"all-gather": 1, "all-reduce": 1}


def test_metadata_kept_and_copied_onto_inserted_collectives():
    text = """HloModule meta

ENTRY main {
  x = f32[16,8] parameter(0), sharding={devices=[8,1]<=[8]}, metadata={op_name="x"}
  w = f32[8,4] parameter(1), sharding={devices=[8,1]<=[8]}, metadata={op_name="w"}
  t = f32[16,8] tanh(x), sharding={devices=[8,1]<=[8]}, metadata={op_name="jit(f)/tanh" source_file="f.py" source_line=3}
  ROOT d = f32[16,4] dot(t, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[8,1]<=[8]}, metadata={op_name="jit(f)/dot" source_file="f.py" source_line=4}
}
"""
    module, out, _ = partition(text)
    assert collectives(module) == {"all-gather": 1}
    for instr in module.entry.instructions:
        assert instr.metadata is not None, instr.name
        if instr.opcode.is_collective:
            assert instr.metadata.source_line == 4  # caused by the dot
    assert verify_equivalent(text, out, num_devices=8).ok


def test_channel_ids_unique():
    text = (CORPUS / "train_dp_adam" / "train_dp_adam.lowered.gspmd.hlo").read_text()
    module, _, _ = partition(text)
    ids = [i.channel_id for i in module.all_instructions() if i.opcode.is_collective]
    assert ids and len(ids) == len(set(ids))


def test_shard_map_region_passes_through_and_matches_xla():
    d = CORPUS / "shard_map_collectives"
    module, out, _ = partition((d / "shard_map_collectives.lowered.shardy.hlo").read_text())
    assert collectives(module) == {"all-reduce": 1, "collective-permute": 1, "all-gather": 1,
                                   "reduce-scatter": 1}
    report = verify_equivalent((d / "shard_map_collectives.compiled.hlo").read_text(), out, num_devices=8)
    assert report.ok, report.format()


def shard_dim0(text: str) -> str:
    module = parse_module(text)
    for p in module.entry.parameters:
        if p.shape.is_array and p.shape.rank >= 1 and p.shape.element_type.is_float:
            dims = [1] * p.shape.rank
            dims[0] = 8
            p.sharding = Sharding.tiled(np.arange(8).reshape(dims))
    return print_module(module)


@pytest.mark.parametrize("program", UNANNOTATED)
def test_corpus_program_sharded_on_dim0_verifies(program):
    text = shard_dim0((CORPUS / program / f"{program}.lowered.gspmd.hlo").read_text())
    module, out, remarks = partition(text)
    assert collectives(module)  # something really was sharded
    report = verify_equivalent(text, out, num_devices=8)
    assert report.ok, report.format()
    for r in remarks:
        if r.kind == "missed" and r.instruction:
            assert r.message.startswith("replicated: ")


def test_fallback_remark_names_the_op_and_source_line():
    text = """HloModule g

ENTRY main {
  x = f32[16,8] parameter(0), sharding={devices=[8,1]<=[8]}
  idx = s32[4,1] parameter(1), sharding={replicated}
  ROOT g = f32[4,2,8] gather(x, idx), offset_dims={1,2}, collapsed_slice_dims={}, start_index_map={0}, index_vector_dim=1, slice_sizes={2,8}, sharding={replicated}, metadata={op_name="take" source_file="model.py" source_line=42}
}
"""
    module, out, remarks = partition(text)
    (r,) = [r for r in remarks if r.kind == "missed"]
    assert r.instruction == "g" and r.source == "model.py:42" and "gather" in r.message
    assert collectives(module) == {"all-gather": 1}
    assert verify_equivalent(text, out, num_devices=8).ok


def test_four_devices():
    text = """HloModule four

ENTRY main {
  x = f32[8,6] parameter(0), sharding={devices=[2,2]<=[4]}
  w = f32[6,4] parameter(1), sharding={devices=[2,1,2]<=[2,2]T(1,0) last_tile_dim_replicate}
  ROOT d = f32[8,4] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
}
"""
    module, out, _ = partition(text, n=4)
    assert collectives(module) == {"all-reduce": 1}
    assert verify_equivalent(text, out, num_devices=4).ok


def test_one_partition_is_a_no_op():
    module = parse_module("HloModule m\n\nENTRY e {\n  ROOT x = f32[4] parameter(0)\n}\n")
    assert not SpmdPartitioner(num_partitions=1).run(module)


def test_demo_example_partitions_with_one_all_reduce():
    """examples/megatron_mlp.hlo (used by `make demo`): column- then row-parallel layers need
    exactly the one all-reduce of the row-parallel partial sums, over the model-axis pairs."""
    path = Path(__file__).resolve().parents[2] / "examples" / "megatron_mlp.hlo"
    text = path.read_text()
    module, out, remarks = partition(text)
    assert collectives(module) == {"all-reduce": 1}
    assert not [r for r in remarks if r.kind == "missed"]
    assert verify_equivalent(text, out, num_devices=8).ok


PARTIALLY_MANUAL_AUTO_TILED = """HloModule partially_manual_auto_tiled, num_partitions=8

region (a: f32[], b: f32[]) -> f32[] {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY e {
  w = f32[8,8] parameter(0), sharding={devices=[1,2,4]<=[4,2]T(1,0) last_tile_dim_replicate}
  open = f32[8,8] custom-call(w), custom_call_target="Sharding", sharding={replicated}, backend_config="unspecified_dims=[0,1]"
  inside = f32[8,8] custom-call(open), custom_call_target="SPMDFullToShardShape", sharding={devices=[1,1,4,2]<=[8] last_tile_dims={manual, replicated}}, backend_config="unspecified_dims=[0,1]"
  two = f32[] constant(2)
  twos = f32[8,8] broadcast(two), dimensions={}
  m = f32[8,8] multiply(inside, twos)
  sum = f32[8,8] all-reduce(m), channel_id=1, replica_groups={{0,2,4,6},{1,3,5,7}}, use_global_device_ids=true, to_apply=region
  back = f32[8,8] custom-call(sum), custom_call_target="Sharding", sharding={devices=[1,1,4,2]<=[8] last_tile_dims={manual, replicated}}, backend_config="unspecified_dims=[0,1]"
  full = f32[8,8] custom-call(back), custom_call_target="SPMDShardToFullShape", sharding={replicated}, backend_config="unspecified_dims=[0,1]"
  ROOT r = f32[8,8] subtract(w, full)
}
"""


def test_partially_manual_region_tiled_over_its_automatic_devices():
    """XLA's propagation tiles a shard_map region's values over the mesh axes it leaves
    automatic (here the region's input takes w's split over 'model' through the open
    dims).  The region is partitioned there as XLA partitions it: the multiply and the psum
    over the manual axis run on [8,4] tiles, and the result computes what XLA's partitioned
    program computes, device by device."""
    module, out, _ = partition(PARTIALLY_MANUAL_AUTO_TILED)
    (psum,) = [i for i in module.all_instructions() if i.opcode is Opcode.ALL_REDUCE]
    assert tuple(psum.shape.dims) == (8, 4)
    xla = pass_dump(PARTIALLY_MANUAL_AUTO_TILED, "spmd-partitioning", num_partitions=8)
    ok, note = _spmd_quality().compare_with_xla(out, xla, 8)
    assert ok, note


@pytest.mark.parametrize("op,etype,dims", [
    ("and", "s32", 6), ("and", "u8", 6), ("or", "s32", 6), ("maximum", "s32", 7),
    ("minimum", "u8", 7), ("multiply", "s32", 5), ("and", "pred", 5), ("xor", "s32", 6),
])
def test_reduce_over_an_uneven_sharded_dim_pads_with_the_reductions_identity(op, etype, dims):
    """The padding of an uneven tile must not change the result: integer `and` pads with all
    bits set (1 would clear every other bit), `minimum` over u8 with 255, ...; xor, which the
    partitioner does not all-reduce, stays correct by gathering."""
    from hlo_passes.runtime import verify_equivalent

    text = f"""HloModule reduce_{op}, num_partitions=4
red {{
  a = {etype}[] parameter(0)
  b = {etype}[] parameter(1)
  ROOT r = {etype}[] {op}(a, b)
}}
ENTRY e {{
  x = {etype}[3,{dims}] parameter(0), sharding={{devices=[1,4]<=[4]}}
  init = {etype}[] parameter(1), sharding={{replicated}}
  ROOT r = {etype}[3] reduce(x, init), dimensions={{1}}, to_apply=red, sharding={{replicated}}
}}
"""
    module = parse_module(text)
    SpmdPartitioner(num_partitions=4).run(module)
    out = print_module(module)
    identity = {"and": {"s32": -1, "u8": 255, "pred": True}, "or": 0, "maximum": -(2**31), "minimum": 255,
                "multiply": 1, "xor": 0}[op]
    identity = identity[etype] if isinstance(identity, dict) else identity
    # reduce's init must hold the identity (XLA leaves other inits undefined under partitioning)
    dtype = {"s32": np.int32, "u8": np.uint8, "pred": np.bool_}[etype]
    rng = np.random.default_rng(0)
    x = rng.integers(0, 2, (3, dims)).astype(bool) if etype == "pred" else \
        rng.integers(1, 100, (3, dims)).astype(dtype) | dtype(0b1010)  # shared bits: `and` is not 0
    report = verify_equivalent(text, out, num_devices=4, inputs=[x, np.array(identity).astype(dtype)])
    assert report.ok, report.format() + "\n" + out


SCATTER_ADD = """add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
"""


def _partition_and_verify(text: str, n: int, inputs):
    from hlo_passes.runtime import verify_equivalent

    module = parse_module(text)
    SpmdPartitioner(num_partitions=n).run(module)
    out = print_module(module)
    report = verify_equivalent(text, out, num_devices=n, inputs=inputs)
    assert report.ok, report.format() + "\n" + out
    return out


def test_take_along_axis_gradient_scatters_into_its_own_vocabulary_rows():
    """The gradient of take_along_axis over a vocabulary-sharded dim (batch over data, vocab over
    model): each device scatters its batch rows' updates with the indices shifted into its own
    vocab rows; the others are out of bounds and skipped.  No collective at all (we gathered
    the whole vocab dim of the operand before)."""
    text = "HloModule taa_grad, num_partitions=8\n" + SCATTER_ADD + """ENTRY e {
  z = f32[] constant(0)
  base = f32[8,6,32] broadcast(z), dimensions={}, sharding={devices=[2,1,4]<=[8]}
  idx = s32[8,6,1,1] parameter(0), sharding={devices=[2,1,1,1,4]<=[8] last_tile_dim_replicate}
  upd = f32[8,6,1] parameter(1), sharding={devices=[2,1,1,4]<=[8] last_tile_dim_replicate}
  ROOT s = f32[8,6,32] scatter(base, idx, upd), update_window_dims={}, inserted_window_dims={2}, scatter_dims_to_operand_dims={2}, input_batching_dims={0,1}, scatter_indices_batching_dims={0,1}, index_vector_dim=3, to_apply=add, sharding={devices=[2,1,4]<=[8]}
}
"""
    rng = np.random.default_rng(0)
    out = _partition_and_verify(text, 8, [rng.integers(0, 32, (8, 6, 1, 1)).astype(np.int32),
                                          rng.standard_normal((8, 6, 1)).astype(np.float32)])
    assert not any(c in out for c in ("all-gather", "all-reduce", "all-to-all", "collective-permute")), out


@pytest.mark.parametrize("vocab", [64, 60])
def test_embedding_gradient_scatters_its_batch_into_its_rows_and_sums_over_data(vocab):
    """The embedding table's gradient with the table sharded by vocabulary over model=4 and the
    token ids by batch over data=2: each device scatters its own batch into its own rows
    (shifted indices), and the data-parallel parts are summed with one all-reduce of a vocab
    shard, as XLA does, instead of gathering every token's update.  Uneven vocab too."""
    text = f"HloModule embed_grad, num_partitions=8\n" + SCATTER_ADD + f"""ENTRY e {{
  z = f32[] constant(0)
  base = f32[{vocab},16] broadcast(z), dimensions={{}}, sharding={{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}}
  idx = s32[8,6,1] parameter(0), sharding={{devices=[2,1,1,4]<=[8] last_tile_dim_replicate}}
  upd = f32[8,6,16] parameter(1), sharding={{devices=[2,1,1,4]<=[8] last_tile_dim_replicate}}
  ROOT s = f32[{vocab},16] scatter(base, idx, upd), update_window_dims={{2}}, inserted_window_dims={{0}}, scatter_dims_to_operand_dims={{0}}, index_vector_dim=2, to_apply=add, sharding={{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}}
}}
"""
    rng = np.random.default_rng(1)
    out = _partition_and_verify(text, 8, [rng.integers(0, vocab, (8, 6, 1)).astype(np.int32),
                                          rng.standard_normal((8, 6, 16)).astype(np.float32)])
    assert out.count(" all-reduce(") == 1 and "all-gather" not in out, out


ROW_PARALLEL_SCAN = """HloModule row_parallel_scan, num_partitions=8

body {
  p = (s32[], f32[8,32,64], f32[3,64,64]) parameter(0), sharding={{replicated}, {devices=[2,1,4]<=[8]}, {devices=[1,4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}}
  i = s32[] get-tuple-element(p), index=0
  x = f32[8,32,64] get-tuple-element(p), index=1
  ws = f32[3,64,64] get-tuple-element(p), index=2
  zero = s32[] constant(0)
  slice = f32[1,64,64] dynamic-slice(ws, i, zero, zero), dynamic_slice_sizes={1,64,64}
  w = f32[64,64] reshape(slice)
  d = f32[8,32,64] dot(x, w), lhs_contracting_dims={2}, rhs_contracting_dims={0}
  t = f32[8,32,64] tanh(d)
  x1 = f32[8,32,64] add(x, t)
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  ROOT out = (s32[], f32[8,32,64], f32[3,64,64]) tuple(i1, x1, ws)
}

cond {
  p = (s32[], f32[8,32,64], f32[3,64,64]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(i, n), direction=LT
}

ENTRY main {
  x = f32[8,32,64] parameter(0), sharding={devices=[2,1,4]<=[8]}
  ws = f32[3,64,64] parameter(1), sharding={devices=[1,4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}
  zero = s32[] constant(0)
  init = (s32[], f32[8,32,64], f32[3,64,64]) tuple(zero, x, ws)
  loop = (s32[], f32[8,32,64], f32[3,64,64]) while(init), condition=cond, body=body
  ROOT r = f32[8,32,64] get-tuple-element(loop), index=1, sharding={devices=[2,1,4]<=[8]}
}
"""


def test_row_parallel_weight_slice_in_a_scan_reduce_scatters_its_partial_matmul():
    """Issue 11: a scan body slices one layer of a row-parallel (Megatron) weight stack; the
    activation's hidden dim, the dot's contracting dim, is sharded over model as the weight's
    rows are, and the result is sharded over model on its hidden dim.  Like XLA, the weight
    stays row-sharded: a local partial matmul whose sum a reduce-scatter over model lands in the
    result's tiling.  The dot's cost model once priced that reduce-scatter as an all-reduce
    (twice the bytes) and chose to gather the activation and all-to-all the weight slice to
    column-parallel on every iteration instead."""
    rng = np.random.default_rng(2)
    out = _partition_and_verify(ROW_PARALLEL_SCAN, 8, [rng.standard_normal((8, 32, 64)).astype(np.float32),
                                                       0.1 * rng.standard_normal((3, 64, 64)).astype(np.float32)])
    module = parse_module(out)
    assert collectives(module) == {"reduce-scatter": 1}, out
    (rs,) = [i for i in module.all_instructions() if i.opcode is Opcode.REDUCE_SCATTER]
    assert rs.parent.name == "body" and rs.shape.dims == (4, 32, 16)
    assert [tuple(g) for g in rs.attr("replica_groups").groups] == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_twin_projections_of_one_activation_share_its_gather():
    """Q, K and V projections of one activation (hidden dim over 8, weights row-sharded, results
    column-sharded): alone, each dot would reduce-scatter its partial product; the three twins
    gather the activation once between them (the gather is shared) and all-to-all their own
    weight, a third of the bytes of three reduce-scatters."""
    shard = "sharding={devices=[1,1,8]<=[8]}"
    dots = "\n".join(f"  {n} = f32[8,32,64] dot(x, w{n}), lhs_contracting_dims={{2}}, rhs_contracting_dims={{0}}, {shard}"
                     for n in "qkv")
    text = f"""HloModule qkv, num_partitions=8

ENTRY main {{
  x = f32[8,32,64] parameter(0), {shard}
  wq = f32[64,64] parameter(1), sharding={{devices=[8,1]<=[8]}}
  wk = f32[64,64] parameter(2), sharding={{devices=[8,1]<=[8]}}
  wv = f32[64,64] parameter(3), sharding={{devices=[8,1]<=[8]}}
{dots}
  qk = f32[8,32,64] multiply(q, k), {shard}
  ROOT o = f32[8,32,64] add(qk, v), {shard}
}}
"""
    rng = np.random.default_rng(3)
    out = _partition_and_verify(text, 8, [rng.standard_normal(s).astype(np.float32)
                                          for s in ((8, 32, 64), (64, 64), (64, 64), (64, 64))])
    assert collectives(parse_module(out)) == {"all-gather": 1, "all-to-all": 3}, out


TUPLE_COPY = """HloModule m, num_partitions=4

ENTRY e {
  a = f32[8,4] parameter(0)
  b = f32[8] parameter(1)
  n = f32[8,4] negate(a), sharding={devices=[4,1]<=[4]}
  t = (f32[8,4], f32[8]) tuple(n, b)
  ROOT c = (f32[8,4], f32[8]) copy(t)ROOT_SHARDING
}
"""


@pytest.mark.parametrize("root_sharding, all_to_alls", [
    ("", 0),  # the output unannotated: replicated, one all-gather
    (", sharding={{devices=[1,4]<=[4]}, {devices=[2,2]<=[4] last_tile_dim_replicate}}", 1),
])
def test_tuple_shaped_copy_takes_each_elements_sharding(root_sharding, all_to_alls):
    """XLA allows a copy of a tuple (it crashed the transpose/copy handler, which read an array
    shape): each element is resharded to its own target, checked against XLA's run."""
    text = TUPLE_COPY.replace("ROOT_SHARDING", root_sharding)
    module = parse_module(text)
    SpmdPartitioner().run(module)
    out = print_module(module)
    assert collectives(module).get("all-to-all", 0) == all_to_alls
    report = verify_equivalent(text, out)
    assert report.ok, report.format()


RNG = """HloModule m, num_partitions=8

ENTRY e {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  r = f32[16,8] rng(a, b), distribution=DISTRIBUTION, sharding=SHARDING
  ROOT n = f32[16,8] negate(r), sharding=SHARDING
}
"""


@pytest.mark.parametrize("sharding, local, all_reduces", [
    ("{devices=[4,2]<=[8]}", (4, 4), 0),
    ("{devices=[4,1,2]<=[8] last_tile_dim_replicate}", (4, 8), 1),
    ("{devices=[1,2,4]<=[4,2]T(1,0) last_tile_dim_replicate}", (16, 4), 1),
    ("{replicated}", (16, 8), 1),
    ("{maximal device=3}", (16, 8), 1),
])
@pytest.mark.parametrize("distribution", ["rng_uniform", "rng_normal"])
def test_rng_draws_each_tile_once_and_replicas_agree(sharding, local, all_reduces, distribution):
    """XLA's HandleRng: each device draws only its tile (no gathered full draw); devices that
    hold the same tile get the first one's numbers through an all-reduce.  rng's numbers cannot
    be compared with an unpartitioned run, so the run checks what can be: every replica of a
    tile holds the same numbers, and uniform draws lie in [a, b)."""
    from hlo_passes.runtime.partitioned import run_global_partitioned

    text = RNG.replace("SHARDING", sharding).replace("DISTRIBUTION", distribution)
    module, out, remarks = partition(text)
    assert not [r for r in remarks if r.kind == "missed"]
    (draw,) = [i for i in module.all_instructions() if i.opcode is Opcode.RNG]
    assert tuple(draw.array_shape.dims) == local
    assert collectives(module).get("all-reduce", 0) == all_reduces
    assert set(collectives(module)) <= {"all-reduce"}
    run_on = parse_module(out)
    original = parse_module(text)
    outputs, problems, _ = run_global_partitioned(
        run_on, [np.float32(2.0), np.float32(5.0)], param_shardings=[None, None],
        root_sharding=run_on.entry.root.sharding, global_root_shape=original.entry.root.shape)
    assert problems == []  # replicas agree
    drawn = -outputs[0]
    assert np.isfinite(drawn).all()
    if distribution == "rng_uniform":
        assert ((drawn >= 2.0) & (drawn < 5.0)).all()
