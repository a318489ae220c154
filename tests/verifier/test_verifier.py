"""The structural verifier: it accepts every module XLA accepts (the golden files, the
corpus, real JAX programs lowered and compiled here) and rejects broken modules that XLA
also rejects, naming the instruction with its printed line and context."""

from pathlib import Path

import pytest

from hlo_passes import HloParseError, parse_module
from hlo_passes.ir import ArrayShape, Instruction, Opcode, PrimitiveType
from hlo_passes.passes.manager import structural_problems
from hlo_passes.verifier import VerificationFailed, check_module, verify_module
from tests.verifier.xla_oracle import xla_rejects

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted([*ROOT.glob("golden/**/*.hlo"), *ROOT.glob("examples/**/*.hlo")])
F32 = PrimitiveType.F32


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_accepts_every_checked_in_module(path):
    module = parse_module(path.read_text(), str(path))
    assert verify_module(module) == []


# ------------------------------------------------------------ real JAX programs --
def _jax_programs():
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    def mlp(w1, w2, x):
        def loss(w1, w2):
            h = jnp.tanh(x @ w1)
            return jnp.mean((h @ w2) ** 2)
        return jax.grad(loss, argnums=(0, 1))(w1, w2)

    def loop(x):
        return jax.lax.fori_loop(0, 5, lambda i, c: c * 0.5 + jnp.sin(c), x)

    def branches(p, x):
        y = jax.lax.cond(p > 0, lambda v: jnp.cumsum(v, axis=0), lambda v: v[::-1], x)
        return jnp.concatenate([y, jnp.pad(x, ((1, 1), (0, 0)))[2:]], axis=0).sum(axis=1)

    mesh = Mesh(jax.devices()[:8], ("d",))
    w1, w2, x = jnp.ones((16, 32)), jnp.ones((32, 4)), jnp.ones((8, 16))
    sharded = jax.jit(mlp, in_shardings=(NamedSharding(mesh, P(None, "d")), NamedSharding(mesh, P("d")),
                                         NamedSharding(mesh, P())))
    yield "mlp", jax.jit(mlp), (w1, w2, x)
    yield "while", jax.jit(loop), (x,)
    yield "cond", jax.jit(branches), (jnp.float32(1), x)
    yield "sharded_mlp", sharded, (w1, w2, x)


@pytest.fixture(scope="module")
def jax_texts():
    texts = {}
    for name, fn, args in _jax_programs():
        lowered = fn.lower(*args)
        texts[f"{name}.lowered"] = lowered.as_text(dialect="hlo")
        texts[f"{name}.compiled"] = lowered.compile().as_text()
    return texts


def test_accepts_real_jax_programs(jax_texts):
    assert len(jax_texts) == 8
    for name, text in jax_texts.items():
        module = parse_module(text, name)
        assert verify_module(module) == [], name
    compiled = jax_texts["sharded_mlp.compiled"]
    assert "fusion" in compiled and ("all-reduce" in compiled or "all-gather" in compiled)


# --------------------------------------------------------------- broken modules --
HEAD = """HloModule m, replica_count=4

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

addi {
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  ROOT s = s32[] add(a, b)
}

ENTRY e {
  p = f32[2,3] parameter(0)
  q = f32[3,4] parameter(1)
"""

# name: (the broken instruction, the same instruction made right, words of the diagnostic)
CASES = {
    "dot_shape": ("ROOT r = f32[2,5] dot(p, q), lhs_contracting_dims={1}, rhs_contracting_dims={0}",
                  "ROOT r = f32[2,4] dot(p, q), lhs_contracting_dims={1}, rhs_contracting_dims={0}",
                  ["should be f32[2,4]", "got f32[2,5]"]),
    "dot_contracting_sizes": ("ROOT r = f32[2,3] dot(p, q), lhs_contracting_dims={1}, rhs_contracting_dims={1}",
                              "ROOT r = f32[2,4] dot(p, q), lhs_contracting_dims={1}, rhs_contracting_dims={0}",
                              ["contracting dimension sizes differ"]),
    "binary_operand_count": ("ROOT r = f32[2,3] add(p)", "ROOT r = f32[2,3] add(p, p)",
                             ["expects 2 operands, but has 1"]),
    "unary_operand_count": ("ROOT r = f32[2,3] negate(p, p)", "ROOT r = f32[2,3] negate(p)",
                            ["expects 1 operand, but has 2"]),
    "implicit_broadcast": ("z = f32[] constant(0)\n  ROOT r = f32[2,3] add(p, z)",
                           "z = f32[] constant(0)\n  b = f32[2,3] broadcast(z), dimensions={}\n"
                           "  ROOT r = f32[2,3] add(p, b)", ["same dimensions"]),
    "compare_type": ("ROOT r = f32[2,3] compare(p, p), direction=LT",
                     "ROOT r = pred[2,3] compare(p, p), direction=LT", ["pred[2,3]"]),
    "transpose": ("ROOT r = f32[2,3] transpose(p), dimensions={1,0}",
                  "ROOT r = f32[3,2] transpose(p), dimensions={1,0}", ["f32[3,2]"]),
    "broadcast": ("ROOT r = f32[2,5,3] broadcast(p), dimensions={0,1}",
                  "ROOT r = f32[2,5,3] broadcast(p), dimensions={0,2}", ["cannot broadcast"]),
    "reshape": ("ROOT r = f32[7] reshape(p)", "ROOT r = f32[6] reshape(p)", ["same number of elements"]),
    "reduce": ("z = f32[] constant(0)\n  ROOT r = f32[3] reduce(p, z), dimensions={1}, to_apply=add",
               "z = f32[] constant(0)\n  ROOT r = f32[2] reduce(p, z), dimensions={1}, to_apply=add",
               ["should be f32[2]"]),
    "slice": ("ROOT r = f32[2,2] slice(p), slice={[0:2], [0:3:2]}",
              "ROOT r = f32[2,2] slice(p), slice={[0:2], [0:3:2]}", None),
    "slice_bounds": ("ROOT r = f32[2,4] slice(p), slice={[0:2], [0:4]}",
                     "ROOT r = f32[2,3] slice(p), slice={[0:2], [0:3]}", ["out of bounds"]),
    "concatenate": ("ROOT r = f32[2,6] concatenate(p, q), dimensions={1}",
                    "ROOT r = f32[2,6] concatenate(p, p), dimensions={1}", ["differ outside dimension 1"]),
    "pad": ("z = f32[] constant(0)\n  ROOT r = f32[4,3] pad(p, z), padding=1_1_1x0_0",
            "z = f32[] constant(0)\n  ROOT r = f32[5,3] pad(p, z), padding=1_1_1x0_0", ["f32[5,3]"]),
    "dynamic_slice": ("i = s32[] constant(0)\n  ROOT r = f32[2,4] dynamic-slice(p, i, i), dynamic_slice_sizes={2,4}",
                      "i = s32[] constant(0)\n  ROOT r = f32[2,2] dynamic-slice(p, i, i), dynamic_slice_sizes={2,2}",
                      ["dynamic_slice_sizes"]),
    # (an out-of-range index crashes XLA's HLO-to-MLIR import instead of being reported)
    "get_tuple_element": ("t = (f32[2,3], f32[3,4]) tuple(p, q)\n  ROOT r = f32[2,3] get-tuple-element(t), index=1",
                          "t = (f32[2,3], f32[3,4]) tuple(p, q)\n  ROOT r = f32[3,4] get-tuple-element(t), index=1",
                          ["should be f32[3,4]"]),
    "overlapping_replica_groups": ("ROOT r = f32[2,3] all-reduce(p), replica_groups={{0,1},{1,2,3}}, to_apply=add",
                                   "ROOT r = f32[2,3] all-reduce(p), replica_groups={{0,1},{2,3}}, to_apply=add",
                                   ["replica 1 appears in more than one"]),
    "all_gather_size": ("ROOT r = f32[6,3] all-gather(p), replica_groups={{0,1},{2,3}}, dimensions={0}",
                        "ROOT r = f32[4,3] all-gather(p), replica_groups={{0,1},{2,3}}, dimensions={0}",
                        ["groups of 2"]),
    "all_gather_unequal_groups": ("ROOT r = f32[6,3] all-gather(p), replica_groups={{0,1,2},{3}}, dimensions={0}",
                                  "ROOT r = f32[8,3] all-gather(p), replica_groups={{0,1,2,3}}, dimensions={0}",
                                  ["same size"]),
    "reduce_scatter_groups": ("ROOT r = f32[1,3] reduce-scatter(p), replica_groups={{0,1,2},{3}}, dimensions={0}, "
                              "to_apply=add",
                              "ROOT r = f32[1,3] reduce-scatter(p), replica_groups={{0,1},{2,3}}, dimensions={0}, "
                              "to_apply=add", ["same size"]),
    "reduce_scatter_size": ("ROOT r = f32[2,3] reduce-scatter(p), replica_groups={{0,1},{2,3}}, dimensions={0}, "
                            "to_apply=add",
                            "ROOT r = f32[1,3] reduce-scatter(p), replica_groups={{0,1},{2,3}}, dimensions={0}, "
                            "to_apply=add", ["groups of 2 divides dimension 0"]),
    "reduce_computation_type": ("z = f32[] constant(0)\n  ROOT r = f32[2] reduce(p, z), dimensions={1}, to_apply=addi",
                                "z = f32[] constant(0)\n  ROOT r = f32[2] reduce(p, z), dimensions={1}, to_apply=add",
                                ["to_apply=addi: parameter 0 is s32[], but it combines f32 values"]),
    "all_reduce_computation_type": ("ROOT r = f32[2,3] all-reduce(p), replica_groups={{0,1,2,3}}, to_apply=addi",
                                    "ROOT r = f32[2,3] all-reduce(p), replica_groups={{0,1,2,3}}, to_apply=add",
                                    ["parameter 0 is s32[], but it combines f32 values"]),
    "all_reduce_channel_zero": ("ROOT r = f32[2,3] all-reduce(p), channel_id=0, replica_groups={{0,1,2,3}}, "
                                "use_global_device_ids=true, to_apply=add",
                                "ROOT r = f32[2,3] all-reduce(p), channel_id=1, replica_groups={{0,1,2,3}}, "
                                "use_global_device_ids=true, to_apply=add", ["channel_id must be positive"]),
    "collective_permute_target": ("ROOT r = f32[2,3] collective-permute(p), source_target_pairs={{0,1},{1,7}}",
                                  "ROOT r = f32[2,3] collective-permute(p), source_target_pairs={{0,1},{1,3}}",
                                  ["target 7 in source_target_pairs is out of range for 4 replicas"]),
    "groups_miss_replicas": ("ROOT r = f32[2,3] all-reduce(p), replica_groups={{0,1,2}}, to_apply=add",
                             "ROOT r = f32[2,3] all-reduce(p), replica_groups={{0,1,2,3}}, to_apply=add",
                             ["must name 4 ids"]),
}


def _module_text(body: str) -> str:
    return HEAD + "  " + body + "\n}\n"


@pytest.mark.parametrize("name", sorted(CASES))
def test_rejects_what_xla_rejects(name):
    bad, good, words = CASES[name]
    if words is None:  # a control: the slice is right, both agree it is
        assert xla_rejects(_module_text(bad)) is None
        assert verify_module(parse_module(_module_text(bad))) == []
        return
    bad_text = _module_text(bad)
    errors = verify_module(parse_module(bad_text, check_semantics=False))
    assert errors, f"{name}: verifier accepts it"
    err = errors[0]
    assert err.instruction == "r" and err.computation == "e"
    for word in words:
        assert word in err.message, err.format()
    rendered = err.format().splitlines()
    assert rendered[0].startswith(f"{err.span}: e/%r: ")  # <input>:line:col of the parsed r
    assert any(line.startswith("  > ") and "r = " in line for line in rendered[1:]), err.format()
    assert xla_rejects(bad_text) is not None, f"{name}: XLA accepts it"
    good_text = _module_text(good)
    assert verify_module(parse_module(good_text)) == []
    assert xla_rejects(good_text) is None


def test_all_reduce_groups_may_differ_in_size_like_xla():
    text = _module_text("ROOT r = f32[2,3] all-reduce(p), replica_groups={{0,1,2},{3}}, to_apply=add")
    assert xla_rejects(text) is None
    assert verify_module(parse_module(text)) == []


# ------------------------------------------------------------- broken graphs --
SMALL = """HloModule m
callee {
  x = f32[4] parameter(0)
  ROOT n = f32[4] negate(x)
}
ENTRY e {
  p = f32[4] parameter(0)
  c = f32[4] call(p), to_apply=callee
  ROOT r = f32[4] add(c, p)
}
"""


def test_well_formed_module_passes_check_module():
    check_module(parse_module(SMALL))


def test_dangling_operand_and_stale_user():
    m = parse_module(SMALL)
    r = m.entry.find("r")
    r.operands = (r.operands[0], m.entry.find("c"), *r.operands[2:])  # bypasses the IR: p still lists r as a user
    messages = [e.message for e in verify_module(m)]
    assert any("lists r as a user, but r does not use it" in msg for msg in messages), messages


def test_operand_from_another_computation():
    m = parse_module(SMALL)
    x = m.computation("callee").find("x")
    r = m.entry.find("r")
    r.set_operand(1, x)
    errors = verify_module(m)
    assert any(e.instruction == "r" and "operand x is in callee" in e.message for e in errors)


def test_missing_callee_parameters_and_root():
    m = parse_module(SMALL)
    callee = m.computation("callee")
    m.computations.remove(callee)  # bypasses remove_computation's own check
    errors = verify_module(m)
    assert any("calls computation callee, which is not in the module" in e.message for e in errors)
    m2 = parse_module(SMALL)
    m2.entry.find("p").parameter_number = 3
    assert any("parameter(3)" in e.message for e in verify_module(m2))
    m3 = parse_module(SMALL)
    m3.entry.root = Instruction(Opcode.NEGATE, ArrayShape(F32, (4,)), name="stray")
    assert any("root stray is not an instruction" in e.message for e in verify_module(m3))


def test_duplicate_names_in_a_computation_and_call_signature():
    m = parse_module(SMALL)
    m.entry.find("c").name = "p"
    assert any("name is used twice in e" in e.message for e in verify_module(m))
    bad = SMALL.replace("ROOT n = f32[4] negate(x)", "ROOT n = f32[4] negate(x)").replace(
        "x = f32[4] parameter(0)", "x = f32[2,2] parameter(0)").replace("negate(x)", "reshape(x)")
    errors = verify_module(parse_module(bad, check_semantics=False))
    assert any("does not match parameter 0 of callee" in e.message for e in errors)
    assert xla_rejects(bad) is not None


def test_check_module_raises_and_pass_manager_uses_it():
    m = parse_module(SMALL)
    m.entry.find("r").shape = ArrayShape(F32, (5,))
    with pytest.raises(VerificationFailed) as info:
        check_module(m)
    assert "e/%r: shape should be f32[4]" in str(info.value)
    assert "> ROOT r = f32[5] add(c, p)" in structural_problems(m)


def test_reducer_signature_is_checked_when_parsing_too():
    """The parser's semantic hook runs the same rule table: XLA's parser rejects this module."""
    from hlo_passes.parse.errors import HloParseError

    text = _module_text("z = f32[] constant(0)\n  ROOT r = f32[2] reduce(p, z), dimensions={1}, to_apply=addi")
    with pytest.raises(HloParseError) as info:
        parse_module(text, "bad.hlo")
    assert "bad.hlo:" in info.value.format() and "to_apply=addi" in info.value.format()


def test_send_and_send_done_share_their_channel():
    """XLA's verifier (VerifyChannels) ties a send to its send-done by channel id; XLA's text
    parser does not take this hand-written send (nor does ours), so the rule is checked against
    the source, on a module read with check_semantics=False."""
    text = """HloModule m
ENTRY e {
  p = f32[4] parameter(0)
  t = token[] after-all()
  s = (f32[4], u32[], token[]) send(p, t), channel_id=5
  sd = token[] send-done(s), channel_id=6
  ROOT r = f32[4] copy(p)
}
"""
    with pytest.raises(HloParseError, match="channel_id must match"):
        parse_module(text)
    errors = verify_module(parse_module(text, check_semantics=False))
    assert [(e.instruction, e.message) for e in errors] == [
        ("sd", "channel_id=6 differs from channel_id=5 of its send s")]
    assert verify_module(parse_module(text.replace("channel_id=6", "channel_id=5"))) == []
    shared = text.replace("ROOT r = f32[4] copy(p)", "ROOT r = f32[4] all-reduce(p), channel_id=5, "
                                                      "replica_groups={}, to_apply=add")
    shared = shared.replace("ENTRY e {", "add {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n"
                                          "  ROOT s = f32[] add(a, b)\n}\nENTRY e {")
    messages = [e.message for e in verify_module(parse_module(shared, check_semantics=False))]
    assert "channel_id=5 is also used by send s: instructions of different kinds may not share a channel" in messages
