"""sharding-propagation against its oracle, XLA's own ShardingPropagation.

- Every golden case (golden/sharding-propagation/, one per opcode family and XLA rule, forward
  and backward) gets, instruction by instruction, the sharding XLA's propagation gives it
  (read from XLA's `after_sharding-propagation` dump); test_golden guards their text.
- Hand-derived cases for what the oracle cannot show: option and header semantics, errors,
  metadata propagation, the call and conditional write-back, deliberate differences.
- Hypothesis: propagation is idempotent and never changes a user's annotation (random modules
  with few annotations); the sharding algebra keeps its laws.
- Random modules with few annotations, propagated and partitioned by us, compute what the
  original computes (XLA's execution as oracle).
- JAX programs: Shardy and GSPMD input forms give equal shardings; XLA accepts what we print.
"""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hlo_passes.ir import Opcode
from hlo_passes.parse.attribute_reader import reader_for
from hlo_passes.parse.module_parser import parse_module
from hlo_passes.printer import print_module
from hlo_passes.passes.spmd import sharding_util as su
from hlo_passes.passes.spmd.sharding_propagation import PropagationError, ShardingPropagation
from tests.spmd.random_hlo import random_module

S = reader_for("sharding")
REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "golden" / "sharding-propagation"
CASES = sorted(p for p in GOLDEN.glob("*.hlo") if not p.name.endswith(".expected.hlo"))


def _benchmark(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    if name in sys.modules:
        return sys.modules[name]
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def _agreement_module():
    return _benchmark("propagation_agreement")


def propagate(text: str, **options):
    module = parse_module(text)
    ShardingPropagation(**options).run(module)
    return module


def sharding_of(module, name: str):
    for instr in module.all_instructions():
        if instr.name == name:
            return instr.sharding if "sharding" in instr.attributes else None
    raise KeyError(name)


def entry(body: str, header: str = "") -> str:
    return f"HloModule m{header}\n\nENTRY e {{\n{body}\n}}\n"


# ------------------------------------------------------------ the oracle --
@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_golden_case_agrees_with_xla(path):
    """Every instruction either propagation shards gets XLA's sharding from ours.  XLA runs in a
    child process for manual regions: its partitioner, after propagation, aborts on some."""
    text = path.read_text()
    agree, total, lines = _agreement_module().agreement(text, show=20, isolate="manual" in text)
    assert total > 0
    assert agree == total, f"{path.name}: {agree}/{total} agree\n" + "\n".join(lines)


def test_random_modules_agree_with_xla():
    """The differential fuzzer (benchmarks/fuzz_propagation.py, `make fuzz-propagation`) on 20
    fixed seeds: random modules with few annotations over every op family, propagated by us and
    by XLA (in a worker process), about 10 s.  Measured 2026-11-26: 166 of 166 instructions;
    before the rules the fuzzer found were fixed, 146 of 166 (88%)."""
    fuzz = _benchmark("fuzz_propagation")
    report = fuzz.run(range(20))
    totals = report.totals()
    assert report.modules >= 18, report.failed
    assert report.agreement() >= 0.97, (f"{totals['agree'] + totals['reorder']}/{sum(totals.values())}\n"
                                         + "\n".join(line for lines in report.rules.values() for line in lines if line))


def test_oracle_sees_a_disagreement():
    """The oracle check can fail: a module whose annotation we drop disagrees with XLA."""
    bench = _agreement_module()
    text = (GOLDEN / "elementwise_forward.hlo").read_text()
    xla = bench.xla_propagation(text)
    ours = parse_module(text)  # not propagated
    pairs = bench.match(ours, xla)
    assert pairs and any("sharding" not in a.attributes and "sharding" in b.attributes for a, b in pairs)


# ------------------------------------------------ header and option rules --
NEGATE = """
  a = f32[8,16] parameter(0)
  n = f32[8,16] negate(a), sharding={devices=[4,1]<=[4]}
  ROOT r = f32[8,16] exponential(n)"""


@pytest.mark.parametrize("header, options, param, root", [
    ("", {}, None, None),  # absent: XLA's default, neither
    (", allow_spmd_sharding_propagation_to_parameters={true}", {}, "{devices=[4,1]<=[4]}", None),
    (", allow_spmd_sharding_propagation_to_output={true}", {}, None, "{devices=[4,1]<=[4]}"),
    ("", {"propagate_to_parameters": True, "propagate_to_output": True}, "{devices=[4,1]<=[4]}",
     "{devices=[4,1]<=[4]}"),
    (", allow_spmd_sharding_propagation_to_output={true}", {"propagate_to_output": False}, None, None),
])
def test_entry_parameters_and_root_follow_the_header_or_the_options(header, options, param, root):
    m = propagate(entry(NEGATE, header), **options)
    assert sharding_of(m, "a") == (S(param) if param else None)
    assert sharding_of(m, "r") == (S(root) if root else None)


def test_uneven_propagated_entry_sharding_becomes_replicated():
    """XLA's divisibility rule: 6 rows do not split in 4, so the allowed parameter and output
    are replicated, while the annotated instruction keeps its uneven tiling."""
    text = entry("""
  a = f32[6,16] parameter(0)
  n = f32[6,16] negate(a), sharding={devices=[4,1]<=[4]}
  ROOT r = f32[6,16] exponential(n)""", ", allow_spmd_sharding_propagation_to_parameters={true}, "
                                          "allow_spmd_sharding_propagation_to_output={true}")
    m = propagate(text)
    assert sharding_of(m, "a") == S("{replicated}")
    assert sharding_of(m, "r") == S("{replicated}")
    assert sharding_of(m, "n") == S("{devices=[4,1]<=[4]}")


def test_per_parameter_flags_restore_the_disallowed_parameter():
    text = entry("""
  a = f32[8,16] parameter(0), sharding={devices=[1,4]<=[4]}
  b = f32[8,16] parameter(1)
  s = f32[8,16] add(a, b), sharding={devices=[4,1]<=[4]}
  ROOT r = f32[8,16] copy(s)""", ", allow_spmd_sharding_propagation_to_parameters={false,true}")
    m = propagate(text)
    assert sharding_of(m, "a") == S("{devices=[1,4]<=[4]}")  # restored, though propagation saw it
    assert sharding_of(m, "b") == S("{devices=[4,1]<=[4]}")


def test_unreached_values_keep_no_sharding_as_in_xla():
    m = propagate(entry("""
  a = f32[8] parameter(0)
  b = f32[8] negate(a)
  ROOT c = f32[8] copy(b)"""))
    assert all("sharding" not in i.attributes for i in m.entry.instructions)


def test_sharding_calls_become_copies_when_asked():
    m = propagate(entry("""
  a = f32[8,16] parameter(0)
  ROOT c = f32[8,16] custom-call(a), custom_call_target="Sharding", sharding={devices=[4,1]<=[4]}"""),
                  keep_sharding_custom_calls=False)
    assert m.entry.root.opcode is Opcode.COPY and m.entry.root.sharding == S("{devices=[4,1]<=[4]}")


def test_metadata_propagates_with_the_sharding_when_asked():
    text = entry("""
  a = f32[8,16] parameter(0), sharding={devices=[4,1]<=[4] metadata={op_name="a"}}
  n = f32[8,16] negate(a), metadata={op_name="n"}
  b = f32[8,16] parameter(1), sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}, metadata={op_name="b"}
  ROOT c = f32[8,16] copy(n)""")
    assert sharding_of(propagate(text), "n").metadata == ""
    m = propagate(text, propagate_metadata=True)
    assert sharding_of(m, "n").metadata == '{op_name="a"}'
    # an annotation without metadata takes its instruction's, as XLA's AssignShardingMetadata does
    assert sharding_of(m, "b").metadata == '{op_name="b"}'


def test_a_call_is_propagated_as_if_inlined_and_keeps_its_body():
    text = """HloModule m

f {
  x = f32[8,16] parameter(0)
  ROOT t = f32[8,16] tanh(x)
}

ENTRY e {
  a = f32[8,16] parameter(0), sharding={devices=[4,1]<=[4]}
  c1 = f32[8,16] call(a), to_apply=f
  ROOT r = f32[8,16] copy(c1)
}
"""
    m = propagate(text)
    assert m.entry.find("c1").opcode is Opcode.CALL
    assert sharding_of(m, "t") == S("{devices=[4,1]<=[4]}")
    assert sharding_of(m, "x") == S("{devices=[4,1]<=[4]}")
    assert sharding_of(m, "c1") == S("{devices=[4,1]<=[4]}")


def test_a_conditional_keeps_its_shape_and_each_branch_its_own_sharding():
    m = propagate((GOLDEN / "conditional.hlo").read_text())
    cond = m.entry.find("c")
    assert cond.opcode is Opcode.CONDITIONAL and not cond.shape.is_tuple
    b0, b1 = cond.called_computations()
    assert b0.root.sharding == S("{devices=[4,1]<=[4]}")
    assert b1.root.sharding == S("{devices=[1,4]<=[4]}")


def test_shard_alike_annotation_goes_and_barriers_go():
    m = propagate((GOLDEN / "shard_as.hlo").read_text())
    assert not any(i.custom_call_target == "Sharding" for i in m.entry.instructions)
    m = propagate((GOLDEN / "barriers.hlo").read_text())
    assert not any((i.custom_call_target or "").startswith("ShardBarrier") for i in m.entry.instructions)


PARTIAL_MANUAL_BLOCKS_CUT = """HloModule m, num_partitions=8

add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT sum = f32[] add(x, y)
}

ENTRY main {
  b = f32[16,8] parameter(0), sharding={devices=[4,2]<=[8]}
  open = f32[16,8] custom-call(b), custom_call_target="Sharding", sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}, backend_config="unspecified_dims=[0,1]"
  inside = f32[4,8] custom-call(open), custom_call_target="SPMDFullToShardShape", sharding={devices=[1,1,4,2]<=[8] last_tile_dims={manual, replicated}}, backend_config="unspecified_dims=[0,1]"
  psum = f32[4,8] all-reduce(inside), channel_id=1, replica_groups={{0,2,4,6},{1,3,5,7}}, use_global_device_ids=true, to_apply=add
  back = f32[4,8] custom-call(psum), custom_call_target="Sharding", sharding={devices=[1,1,4,2]<=[8] last_tile_dims={manual, replicated}}, backend_config="unspecified_dims=[0,1]"
  ROOT full = f32[4,8] custom-call(back), custom_call_target="SPMDShardToFullShape", sharding={replicated}, backend_config="unspecified_dims=[0,1]"
}
"""


def test_partially_manual_region_takes_the_automatic_part_of_an_input_split_over_both_axes():
    """Deliberate difference from XLA's GSPMD propagation (as Shardy, which JAX compiles with,
    propagates): the region's input is tiled [4,2] outside, over the manual x (4) and the
    automatic y (2); the open dims take the part that cuts each manual group's block further
    (dim 1 over y), and the psum over x keeps it, each of its groups holding one y tile.  XLA's
    RefineManualAutoShardingFromAuto needs the tiling replicated over the manual devices and
    leaves the region whole per group.  A psum whose groups span y tiles (a program XLA
    rejects) takes the tiling too, as XLA's rule for all-reduce gives it: the partitioner then
    gathers before the psum."""
    m = propagate(PARTIAL_MANUAL_BLOCKS_CUT)
    region = S("{devices=[1,2,4]<=[4,2]T(1,0) last_tile_dims={manual}}")
    assert sharding_of(m, "open") == S("{devices=[4,2]<=[8]}")
    assert sharding_of(m, "inside") == region
    assert sharding_of(m, "psum") == region
    assert sharding_of(m, "back") == region
    across = propagate(PARTIAL_MANUAL_BLOCKS_CUT.replace("{{0,2,4,6},{1,3,5,7}}", "{{0,1,2,3,4,5,6,7}}"))
    assert sharding_of(across, "inside") == region
    assert sharding_of(across, "psum") == region


@pytest.mark.parametrize("groups, copies", [("{{0,2,4,6},{1,3,5,7}}", 1), ("{{0,1,2,3,4,5,6,7}}", 2)])
def test_partially_manual_psum_partitions_to_the_sum_derived_by_hand(groups, copies):
    """The programs above, partitioned and run on 8 devices.  XLA refuses to run the original with
    groups spanning y, so the oracle is derived by hand: the manual x cuts `b` into four blocks of
    four rows, and the psum adds its group's blocks; a group spanning both y copies of the
    (y-replicated) region adds each block twice."""
    from hlo_passes.passes.spmd.spmd_partitioner import SpmdPartitioner
    from hlo_passes.runtime.partitioned import run_global_partitioned

    text = PARTIAL_MANUAL_BLOCKS_CUT.replace("{{0,2,4,6},{1,3,5,7}}", groups)
    original = parse_module(text)
    module = parse_module(text)
    SpmdPartitioner().run(module)
    partitioned = parse_module(print_module(module))
    b = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    outputs, problems, _ = run_global_partitioned(
        partitioned, [b], param_shardings=[p.sharding for p in original.entry.parameters],
        root_sharding=partitioned.entry.root.sharding, global_root_shape=original.entry.root.shape)
    assert problems == []
    np.testing.assert_allclose(outputs[0], copies * b.reshape(4, 4, 8).sum(0), rtol=1e-5, atol=1e-5)


WIDE_WINDOW = """HloModule m

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY e {
  x = f32[4,24] parameter(0), sharding={devices=[2,4]<=[8]}
  zero = f32[] constant(0)
  c = f32[4,24] reduce-window(x, zero), window={size=1xSIZE pad=0_0xPAD_0}, to_apply=add
  ROOT r = f32[4,24] copy(c)
}
"""


def test_wide_reduce_window_keeps_no_tiling_on_purpose():
    """Deliberate difference from XLA (see propagation_rules.wide_window_dims): a window
    spanning more than half of a dim (20 of 24 rows) does not take that dim's tiling; a remark
    says why."""
    module = parse_module(WIDE_WINDOW.replace("SIZE", "20").replace("PAD", "19"))
    p = ShardingPropagation()
    p.run(module)
    assert sharding_of(module, "c") == S("{devices=[2,1,4]<=[8] last_tile_dim_replicate}")
    assert any("window spans more than half" in r.message for r in p.remarks)


def test_cumulative_window_keeps_its_tiling_as_in_xla():
    """A cumsum's window is as wide as its dim, but the partitioner runs it as a scan of each
    device's rows (ir/cumulative.py): the dim keeps its tiling, XLA's rule, with no remark."""
    module = parse_module(WIDE_WINDOW.replace("SIZE", "24").replace("PAD", "23"))
    p = ShardingPropagation()
    p.run(module)
    assert sharding_of(module, "c") == S("{devices=[2,4]<=[8]}")
    assert not any("window spans more than half" in r.message for r in p.remarks)


@pytest.mark.parametrize("body, message", [
    ("""
  a = f32[8,16] parameter(0), sharding={devices=[2,2]0,1,1,3}
  ROOT r = f32[8,16] copy(a)""", "names a device twice"),
    ("""
  a = f32[8,16] parameter(0)
  ROOT r = (f32[8,16], f32[8,16]) tuple(a, a), sharding={{replicated}}""", "tuple sharding has 1 entries, "
                                                                             "the shape .* has 2 array leaves"),
    ("""
  a = f32[8,16] parameter(0)
  ROOT c = f32[8,16] custom-call(a), custom_call_target="Sharding\"""", "needs a sharding"),
])
def test_bad_annotations_are_clear_errors(body, message):
    with pytest.raises(PropagationError, match=message):
        propagate(entry(body))


@pytest.mark.parametrize("header, options", [(", num_partitions=8", {}), ("", {"num_partitions": 2})])
def test_annotations_must_use_the_program_devices(header, options):
    """XLA's verifier rejects a tiling over another number of devices than the program has; so
    do we (before propagating it anywhere), naming the instruction."""
    with pytest.raises(PropagationError, match="a: sharding .* tiles over 4 devices, but the program has"):
        propagate(entry(NEGATE.replace("parameter(0)", "parameter(0), sharding={devices=[4,1]<=[4]}"), header),
                  **options)


def test_bad_annotation_is_an_input_error_on_the_command_line(tmp_path, capsys):
    from hlo_passes.cli.main import main

    path = tmp_path / "bad.hlo"
    path.write_text(entry("""
  a = f32[8,16] parameter(0), sharding={devices=[2,2]0,1,1,3}
  ROOT r = f32[8,16] copy(a)"""))
    assert main(["run", str(path), "--passes=sharding-propagation"]) == 2
    err = capsys.readouterr().err
    assert "names a device twice" in err and "Traceback" not in err


# ------------------------------------------------------------- properties --
def _annotations(module):
    return {(c.name, i.name): i.sharding for c in module.computations for i in c.instructions
            if "sharding" in i.attributes}


def _calls_whose_result_is_annotated_inside(module):
    """Annotated calls whose result is a value annotated inside the callee (its root, through
    nested calls): XLA inlines calls before propagating and the inlined root keeps its own
    annotation (`ReplaceInstruction` keeps the call's only where the root has none), so the
    call's is not a user annotation propagation must keep (hypothesis found one: a replicated
    call of a body whose nested call's root was tiled)."""
    found = set()
    for comp in module.computations:
        for instr in comp.instructions:
            if instr.opcode.value != "call" or "sharding" not in instr.attributes:
                continue
            inner = instr
            while inner.opcode.value == "call":
                inner = inner.called_computations()[0].root
                if "sharding" in inner.attributes:
                    found.add((comp.name, instr.name))
                    break
    return found


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_module(sparse=True))
def test_propagation_is_idempotent_and_keeps_user_annotations(text):
    module = parse_module(text)
    before = _annotations(module)
    params = {(module.entry.name, p.name) for p in module.entry.parameters}
    root = (module.entry.name, module.entry.root.name)
    allowed = "allow_spmd_sharding_propagation_to_parameters" in text
    overruled = _calls_whose_result_is_annotated_inside(module)
    ShardingPropagation().run(module)
    once = print_module(module)
    after = _annotations(module)
    for key, s in before.items():
        if allowed and (key in params or key == root):
            continue  # the module lets propagation choose these
        if key in overruled:
            continue  # XLA's inliner keeps the callee root's annotation, not the call's
        assert after.get(key) == s, f"{key[1]}: {s} became {after.get(key)}"
    if allowed:
        # Not idempotent by design where parameters may be chosen, as in XLA: a parameter whose
        # propagated sharding does not divide its shape ends replicated (the divisibility rule),
        # and a second run may refine that replicated parameter to a tiling that divides it.
        return
    ShardingPropagation().run(module)
    assert print_module(module) == once


SHARDINGS = st.sampled_from([
    "{devices=[4,1]<=[4]}", "{devices=[2,2]<=[4]}", "{devices=[2,2]<=[2,2]T(1,0)}", "{devices=[1,4]0,2,1,3}",
    "{devices=[2,1,2]<=[4] last_tile_dim_replicate}", "{devices=[1,2,2]0,3,1,2 last_tile_dim_replicate}",
    "{devices=[4,1]3,2,1,0}", "{replicated}"])


@settings(max_examples=60, deadline=None)
@given(SHARDINGS, SHARDINGS, st.lists(st.integers(0, 1), max_size=2))
def test_sharding_algebra_laws(a_text, b_text, dims):
    a, b = su.canon(S(a_text)), su.canon(S(b_text))
    shape = parse_module(entry("  ROOT a = f32[8,12] parameter(0)")).entry.root.shape
    assert su.canon(a) == a
    assert su.transpose(su.transpose(a, [1, 0]), [1, 0]) == a
    assert su.is_subtiling(shape, a, a)
    partial = su.replicate_dims(a, dims)
    assert su.is_subtiling(shape, a, partial)  # replicating dims only coarsens
    merged = su.merge_if_compatible(b, su.num_tiles(partial) + 1, partial)
    if merged is not None:
        assert su.is_subtiling(shape, merged, partial) and su.is_subtiling(shape, merged, su.canon(b))
    assert not (su.is_more_specific(a, b) and su.is_more_specific(b, a))


def test_partial_replication_groups_are_sorted_like_xla():
    """XLA sorts each replica group (HloSharding::PartialTile): two spellings, one sharding."""
    assert su.canon(S("{devices=[2,2]1,0,3,2 last_tile_dim_replicate}")) == S(
        "{devices=[2,2]<=[4] last_tile_dim_replicate}")


# --------------------------------------------- partition and verify (sparse) --
@pytest.fixture(scope="module")
def isolated():
    """Judged in a child process (as test_random_differential.py does): a random module XLA
    itself aborts on (its GSPMD propagation's `IsManualSubgroup` CHECK on a partially manual
    region) killed the test worker here.  Derandomized: CI draws the same modules every run (a
    random draw also met a module XLA's own partition computes wrong, a dynamic-update-slice
    feeding a partially manual region, reported as WRONG; ours matched numpy)."""
    from tests.spmd.fuzz_spmd import IsolatedJudge

    with IsolatedJudge() as judge:
        yield judge


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(text=random_module(sparse=True))
def test_modules_with_few_annotations_partition_to_the_same_program(isolated, text):
    outcome = isolated.judge_text(text)
    assert outcome.kind in ("ok", "skipped"), f"{outcome.kind}: {outcome.detail}\n{outcome.text}\n{outcome.output}"


# -------------------------------------------------- JAX: Shardy vs GSPMD --
def _programs():
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    mesh = jax.make_mesh((4, 2), ("x", "y"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    ns = lambda *spec: NamedSharding(mesh, P(*spec))  # noqa: E731

    def mlp(x, w1, w2):
        h = jax.nn.relu(x @ w1)
        h = jax.lax.with_sharding_constraint(h, ns("x", "y"))
        return (h @ w2).sum(axis=0), h.T.reshape(-1)

    def loop(x, w):
        def body(i, v):
            return jnp.tanh(v @ w)
        return jax.lax.fori_loop(0, 3, body, x)

    def smap(a):
        g = lambda v: jax.lax.psum(v * 2, "x")  # noqa: E731
        b = jax.shard_map(g, mesh=mesh, in_specs=P("x", None), out_specs=P(None, None), axis_names={"x"})(jnp.sin(a))
        return b + 1

    f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)  # noqa: E731
    return {
        "mlp": (jax.jit(mlp, in_shardings=(ns("x", None), ns(None, "y"), ns("y", None)),
                        out_shardings=(ns("y"), None)), (f32(16, 8), f32(8, 8), f32(8, 4))),
        "loop": (jax.jit(loop, in_shardings=(ns("x", "y"), ns("y", None))), (f32(16, 8), f32(8, 8))),
        "shard_map": (jax.jit(smap, in_shardings=(ns("x", "y"),)), (f32(16, 8),)),
    }


def _lower(fn, args, shardy: bool) -> str:
    import jax

    old = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", shardy)
    try:
        return fn.lower(*args).as_text(dialect="hlo")
    finally:
        jax.config.update("jax_use_shardy_partitioner", old)


@pytest.fixture(scope="module")
def lowered():
    return {name: (_lower(fn, args, True), _lower(fn, args, False), fn, args)
            for name, (fn, args) in _programs().items()}


# JAX lets XLA choose the shardings of results it leaves unspecified; its lowered text does not
# record that, so we say it.
AS_JAX = {"propagate_to_output": True}


@pytest.mark.parametrize("program", ["mlp", "loop", "shard_map"])
def test_shardy_and_gspmd_forms_give_equal_shardings(lowered, program):
    shardy, gspmd, _, _ = lowered[program]
    a, b = propagate(shardy, **AS_JAX), propagate(gspmd, **AS_JAX)
    text = print_module(a)
    for shardy_only in ("xla.sdy.sharding", "xla.sdy.meshes", "xla.sdy.FuncResultSharding",
                        "xla.sdy.GlobalToLocalShape", "xla.sdy.LocalToGlobalShape"):
        assert shardy_only not in text
    by_name = {(i.name, i.opcode): i for i in b.all_instructions()}
    compared = 0
    for instr in a.all_instructions():
        twin = by_name.get((instr.name, instr.opcode))
        if twin is None or instr.opcode is Opcode.CUSTOM_CALL or instr.parent.name.startswith("region"):
            continue
        assert instr.sharding == twin.sharding, f"{instr.name}: {instr.sharding} vs {twin.sharding}"
        compared += 1
    assert compared >= 5
    assert a.entry.root.sharding == b.entry.root.sharding


def _compile_spmd(text: str, n: int = 8):
    """XLA's parser and GSPMD partitioner on our output (raises if either refuses it)."""
    import jax
    from jax._src.lib import xla_client as xc

    hlo = xc._xla.hlo_module_from_text(text) if hasattr(xc._xla, "hlo_module_from_text") \
        else xc.hlo.hlo_module_from_text(text)
    mlir = xc._xla.mlir.hlo_to_stablehlo(hlo.as_serialized_hlo_module_proto())
    options = xc.CompileOptions()
    build = options.executable_build_options
    build.num_partitions, build.num_replicas = n, 1
    build.use_spmd_partitioning = True
    build.use_shardy_partitioner = False
    build.device_assignment = xc.DeviceAssignment.create(np.arange(n).reshape(1, n))
    return jax.devices()[0].client.compile_and_load(mlir, jax.devices()[:n], options)


@pytest.mark.parametrize("program", ["mlp", "shard_map"])
def test_xla_spmd_partitioner_accepts_propagated_shardy_input(lowered, program):
    shardy, _, _, _ = lowered[program]
    text = print_module(propagate(shardy, **AS_JAX))
    exe = _compile_spmd(text)
    assert "all-reduce" in exe.hlo_modules()[0].to_string() or program == "mlp"


def _run_spmd(text: str, inputs: list[np.ndarray], n: int = 8) -> list[np.ndarray]:
    """Compile `text` with XLA's SPMD partitioner and run it on `n` CPU devices."""
    import jax
    from jax._src.sharding_impls import GSPMDSharding

    exe = _compile_spmd(text, n)
    devices = jax.devices()[:n]
    args = [jax.device_put(x, GSPMDSharding(devices, s)) for x, s in zip(inputs, exe.get_parameter_shardings())]
    parts = exe.execute_sharded(args).disassemble_into_single_device_arrays()
    module = parse_module(text)
    shapes = module.entry.root.shape.leaves()
    return [np.asarray(jax.make_array_from_single_device_arrays(shape.dims, GSPMDSharding(devices, s), p))
            for shape, s, p in zip(shapes, exe.get_output_shardings(), parts)]


@pytest.mark.parametrize("program", ["mlp", "shard_map"])
def test_propagated_program_computes_the_same_as_jax(lowered, program):
    """Our shardings, partitioned by XLA, compute what the JAX program computes."""
    import jax

    shardy, gspmd, fn, args = lowered[program]
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(a.shape).astype(np.float32) for a in args]
    expected = jax.tree.leaves(fn(*inputs))
    for original in (shardy, gspmd):
        got = _run_spmd(print_module(propagate(original, **AS_JAX)), inputs)
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, np.asarray(e), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("program", ["mlp", "loop"])
def test_verify_equivalent_accepts_propagated_program(lowered, program):
    from hlo_passes import runtime

    shardy, gspmd, _, _ = lowered[program]
    for original in (shardy, gspmd):
        rewritten = print_module(propagate(original, **AS_JAX))
        report = runtime.verify_equivalent(gspmd, rewritten, num_devices=8)
        assert report.ok, report.format()


def test_tuple_shaped_copy_carries_each_element():
    """XLA allows a tuple-shaped copy; propagation moves each element's sharding through it."""
    text = """HloModule m

ENTRY e {
  a = f32[8,4] parameter(0), sharding={devices=[4,1]<=[4]}
  b = f32[8,4] parameter(1)
  t = (f32[8,4], f32[8,4]) tuple(a, b)
  c = (f32[8,4], f32[8,4]) copy(t)
  g1 = f32[8,4] get-tuple-element(c), index=1
  ROOT n = f32[8,4] negate(g1), sharding={devices=[1,4]<=[4]}
}
"""
    try:
        module = parse_module(text)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"the front end does not read a tuple-shaped copy yet: {e}")
    ShardingPropagation().run(module)
    assert sharding_of(module, "c") == S("{{devices=[4,1]<=[4]}, {devices=[1,4]<=[4]}}")


CALL_RETURNING_A_TUPLE = """HloModule call_tuple, num_partitions=4, allow_spmd_sharding_propagation_to_output={true}
pair {
  x = f32[8,16] parameter(0)
  n = f32[8,16] negate(x)
  a = f32[8,16] abs(x)
  ROOT t = (f32[8,16], f32[8,16]) tuple(n, a)
}
ENTRY e {
  p = f32[8,16] parameter(0), sharding={devices=[4,1]<=[4]}
  c = (f32[8,16], f32[8,16]) call(p), to_apply=pair
  g0 = f32[8,16] get-tuple-element(c), index=0
  g1 = f32[8,16] get-tuple-element(c), index=1
  ROOT s = f32[8,16] add(g0, g1)
}
"""


def test_a_call_returning_a_tuple_takes_its_elements_shardings():
    """XLA inlines the call before it propagates, so its ROOT tuple disappears into the reads of
    its elements; the call (and the callee's ROOT) must still get the tuple of the elements'
    shardings, or the partitioner gathers what the callee computed tiled."""
    from hlo_passes.passes.spmd.spmd_partitioner import SpmdPartitioner
    from hlo_passes.runtime import verify_equivalent

    module = parse_module(CALL_RETURNING_A_TUPLE)
    ShardingPropagation().run(module)
    call = next(i for i in module.entry.instructions if i.opcode is Opcode.CALL)
    tiled = reader_for("sharding")("{devices=[4,1]<=[4]}")
    assert call.sharding.kind is su.ShardingKind.TUPLE and list(call.sharding.elements) == [tiled, tiled]
    module = parse_module(CALL_RETURNING_A_TUPLE)
    SpmdPartitioner(num_partitions=4).run(module)
    out = print_module(module)
    assert "all-gather" not in out and "all-reduce" not in out, out
    assert verify_equivalent(CALL_RETURNING_A_TUPLE, out, num_devices=4).ok


NESTED_CALL_RETURNING_A_TUPLE = """HloModule nested_call_tuple, num_partitions=4, allow_spmd_sharding_propagation_to_output={true}
pair {
  x = f32[8,16] parameter(0)
  n = f32[8,16] negate(x)
  a = f32[8,16] abs(x)
  ROOT t = (f32[8,16], f32[8,16]) tuple(n, a)
}
mid {
  y = f32[8,16] parameter(0)
  c = (f32[8,16], f32[8,16]) call(y), to_apply=pair
  g0 = f32[8,16] get-tuple-element(c), index=0
  g1 = f32[8,16] get-tuple-element(c), index=1
  ROOT m = f32[8,16] multiply(g0, g1)
}
ENTRY e {
  p = f32[8,16] parameter(0), sharding={devices=[4,1]<=[4]}
  r = f32[8,16] call(p), to_apply=mid
  ROOT s = f32[8,16] add(r, p)
}
"""


def test_a_call_inside_a_called_computation_keeps_its_tuple_sharding():
    """Callees are inlined first, so the inner call is already gone when `mid` is inlined into
    the entry; its tuple still stands for it there (the dropout RNG of a real GPT step, a
    threefry call inside `_uniform` inside `_bernoulli`, was gathered whole per layer)."""
    from hlo_passes.passes.spmd.spmd_partitioner import SpmdPartitioner
    from hlo_passes.runtime import verify_equivalent

    module = parse_module(NESTED_CALL_RETURNING_A_TUPLE)
    ShardingPropagation().run(module)
    inner = next(i for c in module.computations for i in c.instructions
                 if i.opcode is Opcode.CALL and i.called["to_apply"].name == "pair")
    tiled = reader_for("sharding")("{devices=[4,1]<=[4]}")
    assert inner.sharding.kind is su.ShardingKind.TUPLE and list(inner.sharding.elements) == [tiled, tiled]
    module = parse_module(NESTED_CALL_RETURNING_A_TUPLE)
    SpmdPartitioner(num_partitions=4).run(module)
    out = print_module(module)
    assert "all-gather" not in out and "all-reduce" not in out, out
    assert verify_equivalent(NESTED_CALL_RETURNING_A_TUPLE, out, num_devices=4).ok
