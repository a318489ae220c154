"""What the random JAX-program fuzzer (tests/dumps/fuzz_jax_dumps.py) found, each as a small
module written here and checked against XLA's execution.

* An ENTRY result read from a tuple (`ROOT gte = get-tuple-element(tuple(x))`, what JAX lowers a
  jit with `out_shardings` to) lost its annotation: propagation folds the read as XLA's import
  does, and the annotation went with it, so the output came back replicated where the user
  asked for it tiled (seeds 5, 8, 9: `hlo-passes run --verify` refused our own output).
* `verify` of XLA's own compile (`verify DIR --module M`, before_optimizations against the
  after_optimizations it recompiles) read the global module as a per-device one when every
  parameter is replicated: the recompiled module's parameters have no layouts, so they "differed"
  from the global ones, and a result tiled by XLA looked wrong.
"""

from __future__ import annotations

from pathlib import Path

import subprocess
import sys

import pytest

from hlo_passes.parse.module_parser import parse_module
from hlo_passes.passes.spmd.spmd_partitioner import SpmdPartitioner
from hlo_passes.printer import print_module
from hlo_passes.runtime import verify_equivalent

ROOT_READ = """HloModule root_read, entry_computation_layout={(f32[12,1,12]{2,1,0})->f32[12,1,12]{2,1,0}}, num_partitions=8

%body (p: f32[12,1,12]) -> f32[12,1,12] {
  %p = f32[12,1,12]{2,1,0} parameter(0)
  ROOT %n = f32[12,1,12]{2,1,0} negate(%p)
}

ENTRY %main (a: f32[12,1,12]) -> f32[12,1,12] {
  %a = f32[12,1,12]{2,1,0} parameter(0), sharding=PARAM
  %c = f32[12,1,12]{2,1,0} call(%a), to_apply=%body
  %t = (f32[12,1,12]{2,1,0}) tuple(%c)
  ROOT %g = f32[12,1,12]{2,1,0} get-tuple-element(%t), index=0, sharding=RESULT
}
"""

GSPMD = ("{replicated}", "{devices=[4,1,2]<=[2,2,2]T(2,1,0)}")
SHARDY = ("{mesh['a'=2,'b'=2,'c'=2], [{}, {}, {}]}", "{mesh['a'=2,'b'=2,'c'=2], [{'c', 'b'}, {}, {'a'}]}")


@pytest.mark.parametrize("form", [GSPMD, SHARDY], ids=["gspmd", "shardy"])
def test_a_result_read_from_a_tuple_keeps_its_sharding(form):
    text = ROOT_READ.replace("PARAM", form[0]).replace("RESULT", form[1])
    module = parse_module(text)
    SpmdPartitioner().run(module)
    out = print_module(module)
    assert module.entry.root.shape.dims == (3, 1, 6), out  # tiled as asked, not replicated
    report = verify_equivalent(text, out)
    assert report.ok, report.format() + "\n" + out


def test_a_result_read_from_a_tuple_of_a_parameter_keeps_its_sharding():
    # The value read is a parameter with a sharding of its own: the read stays, and reshards it.
    text = ROOT_READ.replace("PARAM", GSPMD[0]).replace("RESULT", GSPMD[1]).replace(
        "tuple(%c)", "tuple(%a)")
    module = parse_module(text)
    SpmdPartitioner().run(module)
    out = print_module(module)
    assert module.entry.root.shape.dims == (3, 1, 6), out
    report = verify_equivalent(text, out)
    assert report.ok, report.format() + "\n" + out


# A global module whose one parameter is replicated and whose result is tiled, and the
# per-device program XLA compiles it to, as after_optimizations prints it (scheduled, laid out).
GLOBAL = """HloModule reduce_rows, entry_computation_layout={(f32[16,16]{1,0})->f32[16]{0}}, num_partitions=8

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

ENTRY %main (a: f32[16,16]) -> f32[16] {
  %a = f32[16,16]{1,0} parameter(0), sharding={replicated}
  %zero = f32[] constant(0)
  %r = f32[16]{0} reduce(%a, %zero), dimensions={1}, to_apply=%add
  ROOT %n = f32[16]{0} negate(%r), sharding={devices=[8]<=[8]}
}
"""

PER_DEVICE = """HloModule reduce_rows, is_scheduled=true, entry_computation_layout={(f32[16,16]{1,0})->f32[2]{0}}, num_partitions=8

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

ENTRY %main_spmd (a: f32[16,16]) -> f32[2] {
  %a = f32[16,16]{1,0} parameter(0)
  %pid = u32[] partition-id()
  %two = u32[] constant(2)
  %row = u32[] multiply(%pid, %two)
  %col = u32[] constant(0)
  %rows = f32[2,16]{1,0} dynamic-slice(%a, %row, %col), dynamic_slice_sizes={2,16}
  %zero = f32[] constant(0)
  %r = f32[2]{0} reduce(%rows, %zero), dimensions={1}, to_apply=%add
  ROOT %n = f32[2]{0} negate(%r)
}
"""


def test_verify_reads_a_global_module_with_replicated_parameters_as_global():
    report = verify_equivalent(GLOBAL, PER_DEVICE)
    assert report.ok, report.format()
    assert report.readings[0].startswith("ORIGINAL: global program"), report.readings
    wrong = PER_DEVICE.replace("ROOT %n = f32[2]{0} negate(%r)", "ROOT %n = f32[2]{0} add(%r, %r)")
    assert not verify_equivalent(GLOBAL, wrong).ok


# XLA folds an iota into a constant and its after_optimizations dump prints the constant's
# values as `{...}`: XLA's parser reads that back with values of its own, so verify compared
# XLA's compile with made-up numbers and said XLA was wrong (seed 2001 --big, gspmd).
IOTA = """HloModule iota_rows, num_partitions=8

ENTRY %main (a: f32[12]) -> f32[12] {
  %a = f32[12] parameter(0), sharding={replicated}
  %i = s32[12] iota(), iota_dimension=0
  %f = f32[12] convert(%i)
  ROOT %m = f32[12] multiply(%a, %f), sharding={replicated}
}
"""

FOLDED = """HloModule iota_rows, is_scheduled=true, num_partitions=8

ENTRY %main_spmd (a: f32[12]) -> f32[12] {
  %a = f32[12]{0} parameter(0)
  %c = f32[12]{0} constant({...})
  ROOT %m = f32[12]{0} multiply(%a, %c)
}
"""


def test_verify_refuses_a_constant_whose_values_the_dump_elides():
    from hlo_passes.runtime.verify import VerificationError

    with pytest.raises(VerificationError, match=r"values elided .*xla_dump_large_constants"):
        verify_equivalent(IOTA, FOLDED)
    # the same elided constant on both sides (a pass that kept it) still compares
    assert verify_equivalent(FOLDED, FOLDED).ok


# XLA's SPMD partitioner cuts a grouped convolution's output features below the group count
# (8 devices: 1 feature per device, feature_group_count=2) and then rejects its own conv: JAX's
# jit fails (seed 41).  Our partition of it verifies; where the original needs XLA's partitioner
# to run at all (a manual region), `run --verify` must say that XLA failed on the input, not
# that hlo-passes has a bug.
MANUAL_THEN_GROUPED_CONV = """HloModule grouped_conv, num_partitions=8

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

ENTRY %main (x: f32[16,12,12], k: f32[1,6,4]) -> f32[16,12,4] {
  %x = f32[16,12,12] parameter(0), sharding={devices=[8,1,1]<=[8]}
  %k = f32[1,6,4] parameter(1), sharding={replicated}
  %s = f32[16,12,12] custom-call(%x), custom_call_target="Sharding", sharding={devices=[8,1,1]<=[8]}
  %m = f32[2,12,12] custom-call(%s), custom_call_target="SPMDFullToShardShape", sharding={manual}
  %r = f32[2,12,12] all-reduce(%m), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%add
  %t = f32[2,12,12] custom-call(%r), custom_call_target="Sharding", sharding={manual}
  %full = f32[16,12,12] custom-call(%t), custom_call_target="SPMDShardToFullShape", sharding={devices=[8,1,1]<=[8]}
  %conv = f32[16,12,4] convolution(%full, %k), window={size=1}, dim_labels=b0f_0io->b0f, feature_group_count=2
  ROOT %c = f32[16,12,4] custom-call(%conv), custom_call_target="Sharding", sharding={devices=[1,1,4,2]<=[8] last_tile_dim_replicate}
}
"""


def test_grouped_conv_with_features_cut_below_the_groups_verifies():
    text = MANUAL_THEN_GROUPED_CONV.split("ENTRY")[0] + """ENTRY %main (x: f32[16,12,12], k: f32[1,6,4]) -> f32[16,12,4] {
  %x = f32[16,12,12] parameter(0), sharding={replicated}
  %k = f32[1,6,4] parameter(1), sharding={replicated}
  %conv = f32[16,12,4] convolution(%x, %k), window={size=1}, dim_labels=b0f_0io->b0f, feature_group_count=2
  ROOT %c = f32[16,12,4] custom-call(%conv), custom_call_target="Sharding", sharding={devices=[1,1,4,2]<=[8] last_tile_dim_replicate}
}
"""
    module = parse_module(text)
    SpmdPartitioner().run(module)
    out = print_module(module)
    report = verify_equivalent(text, out)
    assert report.ok, report.format() + "\n" + out


def test_run_verify_judges_a_module_xla_cannot_partition_by_its_regions_run_directly(tmp_path):
    """XLA rejects its own partition of the original; its manual region is fully manual, so
    the regions run directly on each device (runtime/manual_regions.py) are the oracle."""
    src = tmp_path / "in.hlo"
    src.write_text(MANUAL_THEN_GROUPED_CONV)
    p = subprocess.run([sys.executable, "-m", "hlo_passes", "run", str(src), "--passes", "spmd-partition", "--verify",
                        "-q", "-o", str(tmp_path / "out.hlo")], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parents[2])
    assert p.returncode == 0, p.stderr
    assert "EQUIVALENT" in p.stderr and "XLA cannot partition this global module" in p.stderr, p.stderr
    assert "feature_group_count" in p.stderr and "manual_regions.py" in p.stderr, p.stderr


def test_run_verify_reports_xla_failing_on_the_original_as_xla(tmp_path, monkeypatch, capsys):
    """Where the direct run declines the module too, no oracle is left: `run --verify` says
    that XLA failed on the input (exit 2), not that hlo-passes has a bug."""
    from hlo_passes.cli.main import main
    from hlo_passes.runtime import manual_regions
    monkeypatch.setattr(manual_regions, "run_direct", lambda *args, **kwargs: None)
    src = tmp_path / "in.hlo"
    src.write_text(MANUAL_THEN_GROUPED_CONV)
    rc = main(["run", str(src), "--passes", "spmd-partition", "--verify", "-q", "-o", str(tmp_path / "out.hlo")])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "XLA could not compile or run the original module" in err, err
    assert "feature_group_count" in err and "internal error" not in err, err
    assert not (tmp_path / "out.hlo").exists()


DATA = Path(__file__).resolve().parent / "data"


def test_variadic_all_gather_of_seed_2014_matches_the_separate_gathers():
    """Narrowed from XLA's after_optimizations dump (JAX-program fuzz seed 2014, --big,
    gspmd): one variadic all-gather of two transposed operands against two separate ones.
    They mean the same; the runtime runs variadic all-gathers split, so verification says so."""
    separate = (DATA / "variadic_all_gather_2014.separate.hlo").read_text()
    combined = (DATA / "variadic_all_gather_2014.combined.hlo").read_text()
    assert verify_equivalent(separate, combined).ok


def test_xla_cpu_misplaces_the_variadic_all_gather_of_seed_2014():
    """Why the runtime splits variadic all-gathers: XLA CPU, run on the merged gather as written,
    gives its second result wrong on every device.  Its layout assignment makes the gathered
    dimension major for a single all-gather (f32[12,1,16]{1,2,0}) but gives the variadic one
    {1,0,2}, taken from the transposes around it, where dimension 0 is not major; its runtime
    concatenates the devices' buffers, so the pieces interleave wrongly.  When a jaxlib
    fixes that, this fails, and the split (`per_device.split_variadic_collectives`) can go."""
    import numpy as np
    from hlo_passes.runtime import xla_backend
    from hlo_passes.runtime.per_device import as_replica_program, random_inputs
    separate = (DATA / "variadic_all_gather_2014.separate.hlo").read_text()
    combined = (DATA / "variadic_all_gather_2014.combined.hlo").read_text()
    inputs = random_inputs(separate, 8, seed=3)
    want = xla_backend.compile_hlo(as_replica_program(separate, 8), num_replicas=8).run(inputs)
    as_written = as_replica_program(combined, 8, split_all_gathers=False)
    assert "all-gather(" in as_written and ") all-gather(" in as_written  # still one tuple-shaped gather
    got = xla_backend.compile_hlo(as_written, num_replicas=8).run(inputs)
    assert all(not np.allclose(w[0], g[0]) for w, g in zip(want, got))
    split = xla_backend.compile_hlo(as_replica_program(combined, 8), num_replicas=8).run(inputs)
    assert all(np.array_equal(w[0], s[0]) for w, s in zip(want, split))


def test_partially_manual_hints_that_abort_xla_are_dropped_for_verification(tmp_path):
    """JAX-program fuzz seed 2003 (--big, gspmd): JAX's GSPMD lowering of a partially manual
    shard_map writes `Sharding` annotations with `unspecified_dims` inside the manual region, and
    XLA's GSPMD propagation aborts the process on them (jit of the program dies the same way), so
    `run --verify` died with it.  The hint changes XLA's plan, not the values: verification drops
    it, says so, and verifies our partition (in a child process: before, it aborted)."""
    src = DATA / "manual_subgroup_unspecified_dims_2003.before_optimizations.txt"
    p = subprocess.run([sys.executable, "-m", "hlo_passes", "run", str(src), "--passes", "spmd-partition", "--verify",
                        "-q", "-o", str(tmp_path / "out.hlo")], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parents[2], timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "EQUIVALENT" in p.stdout + p.stderr and "dropped unspecified_dims" in p.stdout + p.stderr


def test_seed_2035_our_partition_matches_the_truth_where_xlas_partition_does_not():
    """JAX-program fuzz seed 2035 (--big, shardy), reduced: a dynamic-update-slice writes one row
    of a [2,4] value whose rows are sharded over four devices (two of them padding), beside a
    shard_map.  `verify` reported a MISMATCH, but the oracle was wrong: XLA's own partition of
    the original leaves the row unwritten.  Judged against the values computed by hand (a
    sigmoid, then the row replaced), our partition is right.  The output needs no manual region,
    so `verify` now computes its expected value on one device, unpartitioned, and the report is
    EQUIVALENT.  When a jaxlib fixes XLA's partitioner, the last assertion fails."""
    import numpy as np
    from hlo_passes.ir.program_kind import read_program
    from hlo_passes.runtime.partitioned import run_xla_spmd
    from hlo_passes.runtime.verify import random_inputs
    text = (DATA / "dus_uneven_rows_2035.hlo").read_text()
    module = parse_module(text)
    SpmdPartitioner().run(module)
    inputs = random_inputs(parse_module(text), seed=0)
    report = verify_equivalent(text, print_module(module), inputs=inputs)
    update, index, x = inputs[3], int(inputs[4]), inputs[5]
    row = min(max(index + 2 if index < 0 else index, 0), 1)
    truth = 1 / (1 + np.exp(-x))
    truth[row:row + 1] = update
    assert report.ok, report.format()
    assert np.allclose(report.actual[0], truth, rtol=1e-6, atol=1e-6)
    assert np.allclose(report.expected[0], truth, rtol=1e-6, atol=1e-6)
    xlas, _, _ = run_xla_spmd(parse_module(text), inputs, read_program(parse_module(text)).num_devices, None, [])
    assert not np.allclose(xlas[0], truth)  # XLA's partition of the original (its fault)


def test_seed_3202_a_result_laid_out_otherwise_than_xla_here_chooses_is_a_clear_error():
    """JAX-program fuzz seed 3202 (gspmd), `verify DIR` of XLA's own compile: the per-device
    after_optimizations does not say how its result is sharded, so verify asks XLA's partitioner
    for ORIGINAL's result sharding.  Here XLA chooses another layout for the shard_map output
    (JAX's compile merged both of its tilings; ours, without the partially manual regions'
    `unspecified_dims` hints XLA aborts on, keeps one), which does not cut the result into the
    program's tiles.  That is an error naming the way out (the result's sharding given), and
    with it the program verifies."""
    from hlo_passes.ir.sharding import Sharding
    from hlo_passes.parse.attribute_reader import reader_for
    from hlo_passes.runtime.verify import VerificationError

    before = (DATA / "result_layout_3202.before_optimizations.txt").read_text()
    after = (DATA / "result_layout_3202.cpu_after_optimizations.txt").read_text()
    with pytest.raises(VerificationError, match=r"does not cut it into REWRITTEN's tiles.*--result-sharding"):
        verify_equivalent(before, after)
    given = reader_for("sharding")("{{replicated}, {replicated}, {devices=[1,1,4,2]<=[8]}}")
    assert isinstance(given, Sharding)
    report = verify_equivalent(before, after, root_sharding=given)
    assert report.ok, report.format()


def test_exported_shardy_body_shardings_keep_the_region_manual():
    """JAX-program quality seed 4019 (--big, shardy), as a small program: `shard_map` manual over
    'b' only, its body a `psum` over 'b', the result wanted tiled over 'a'.  XLA's dump of the
    Shardy lowering writes the body's annotations over the free axes alone (`{mesh['a'=4,'b'=2],
    [{?}, {?}, {?}]}`); read as they stand they said "replicated on every device", the body was
    computed whole along 'a' and its all-reduce moved 4x XLA's bytes.  Imported as the body's
    own (the region's manual groups, dims open), the body is split over 'a' as XLA splits it:
    each device all-reduces [16,2,8], and the partition verifies."""
    from hlo_passes.stats import module_stats
    text = (DATA / "partial_shard_map_open_body_shardy.before_optimizations.txt").read_text()
    module = parse_module(text)
    SpmdPartitioner().run(module)
    out = print_module(module)
    reduces = [i for i in module.all_instructions() if i.opcode.value == "all-reduce"]
    assert [tuple(i.array_shape.dims) for i in reduces] == [(16, 2, 8)], out
    assert sum(module_stats(module).collective_bytes.values()) == 16 * 2 * 8 * 4
    assert verify_equivalent(text, out).ok


def test_seed_5019_our_convolution_matches_numpy_where_xlas_partition_doubles_it():
    """JAX-program quality seed 5019 (--big, gspmd): a convolution (its kernel tiled on the
    window and input feature, two replicas of each tile) reads a value computed by a shard_map
    manual over one axis and replicated over the rest.  `verify` reports a MISMATCH on the
    convolution's output, ours half of the oracle's: the oracle is XLA's partition of the
    original (the output depends on the manual region), and JAX's own run agrees with it.  But
    XLA's partition is the one that is wrong: the convolution computed with NumPy from the
    convolution's input (an extra output of the module, output 4, on which both partitions
    agree) is ours, and XLA's is exactly twice it (the replicas' partial sums counted twice).
    When a jaxlib fixes XLA's partitioner, the last assertion fails."""
    import numpy as np
    from hlo_passes.runtime.verify import random_inputs
    text = (DATA / "conv_after_manual_region_5019.hlo").read_text()
    module = parse_module(text)
    SpmdPartitioner().run(module)
    inputs = random_inputs(parse_module(text), seed=0)
    report = verify_equivalent(text, print_module(module), inputs=inputs)
    assert [o.ok for o in report.outputs] == [True, True, True, False, True], report.format()
    x = report.expected[4].reshape(5, 4, 2)  # the convolution's input, as XLA computes it (= ours)
    k = inputs[7]  # f32[2,2,1]: window 2 (dilated by 2: input positions 0 and 2), 2 in, 1 out
    truth = (x[:, 0, :] @ k[0] + x[:, 2, :] @ k[1]).reshape(5, 1, 1)
    np.testing.assert_allclose(report.actual[3], truth, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(report.expected[3], 2 * truth, rtol=1e-5, atol=1e-6)


def test_exported_shardy_open_operand_dims_stay_open():
    """`shard_map(lambda x, w: psum(x @ w, 'm'), axis_names={'m'})` on a (d=2, m=4) mesh, x tiled
    over 'd' outside: XLA's dump of the Shardy lowering writes the region's operand annotations
    with open dims (`[{?}, {'m', ?}]`).  Read closed, x was gathered over 'd' into the region and
    the matmul ran on all its rows (2.5x XLA's bytes, 2x its FLOPs); open, the rows stay tiled
    over 'd' through the region, as XLA's Shardy partition keeps them: one all-reduce of each
    device's [16,32] partial product."""
    from hlo_passes.stats import module_stats
    text = (DATA / "partial_shard_map_open_operands_shardy.before_optimizations.txt").read_text()
    module = parse_module(text)
    SpmdPartitioner().run(module)
    out = print_module(module)
    kinds = module_stats(module).collective_bytes
    assert kinds == {"all-reduce": 16 * 32 * 4}, (kinds, out)
    assert verify_equivalent(text, out).ok


def test_exported_shardy_fully_open_result_tuple_lets_the_result_tiling_into_the_body():
    """`shard_map(lambda y: all_gather(y, 'b', axis=1, tiled=True) * 2, axis_names={'b'},
    out_specs=P())` on an (a=4, b=2) mesh, x tiled (a, b) outside and the jit's result wanted
    tiled over 'a'.  XLA's dump of the Shardy lowering writes the tuple of the jit's results
    fully open (`{{mesh[...], [{?}, {?}, {?}]}}`): read as a fixed replicated sharding it kept
    the result's 'a' tiling from reaching back through the region's SPMDShardToFullShape, so
    the body gathered its rows over 'a' and multiplied all 32 of them on every device (4x XLA's
    FLOPs), slicing its 8 afterwards.  Open, the rows stay tiled over 'a' through the body: the
    only collective is the body's own all-gather over 'b', of each device's [8,8,8]."""
    from hlo_passes.stats import module_stats
    text = (DATA / "partial_shard_map_all_gather_open_results_shardy.before_optimizations.txt").read_text()
    module = parse_module(text)
    SpmdPartitioner().run(module)
    out = print_module(module)
    gathers = [i for i in module.all_instructions() if i.opcode.value == "all-gather"]
    assert [tuple(i.operands[0].array_shape.dims) for i in gathers] == [(8, 8, 8)], out
    multiply, = [i for i in module.all_instructions() if i.opcode.value == "multiply"]
    assert tuple(multiply.array_shape.dims) == (8, 16, 8), out
    assert module_stats(module).collective_bytes == {"all-gather": 8 * 8 * 8 * 4}
    assert verify_equivalent(text, out).ok
