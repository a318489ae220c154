"""`Reduction`: one recogniser, one identity, one computation per module.  The identities are
checked by XLA itself: `x OP identity` computes x for every x of the type, extremes included."""

import numpy as np
import pytest

from hlo_passes import parse_module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.reduction import Reduction
from hlo_passes.ir.types import PrimitiveType as T

CASES = [(op, t) for op in (Opcode.ADD, Opcode.MULTIPLY, Opcode.MAXIMUM, Opcode.MINIMUM)
         for t in (T.F32, T.S32, T.U8, T.PRED)] + \
        [(op, t) for op in (Opcode.AND, Opcode.OR, Opcode.XOR) for t in (T.S32, T.U8, T.PRED)]


def _literal(value, etype) -> str:
    if etype is T.PRED:
        return "true" if value else "false"
    if isinstance(value, float) and np.isinf(value):
        return "-inf" if value < 0 else "inf"
    return str(value)


def _samples(etype):
    if etype is T.PRED:
        return np.array([True, False, True, False])
    if etype.is_float:
        return np.array([-3.5, 0.0, 7.25, np.finfo(np.float32).max], np.float32)
    info = np.iinfo(etype.numpy_dtype())
    return np.array([info.min, 0, 5, info.max], etype.numpy_dtype())


@pytest.mark.parametrize("opcode,etype", CASES, ids=lambda v: getattr(v, "value", v))
def test_identity_leaves_every_value_unchanged_in_xla(opcode, etype):
    from hlo_passes.runtime import xla_backend

    identity = Reduction(opcode, etype).identity
    t = etype.value
    text = f"""HloModule m
ENTRY e {{
  x = {t}[4] parameter(0)
  c = {t}[] constant({_literal(identity, etype)})
  b = {t}[4] broadcast(c), dimensions={{}}
  ROOT r = {t}[4] {opcode.value}(x, b)
}}
"""
    x = _samples(etype)
    (out,) = xla_backend.run_single(text, [x])
    np.testing.assert_array_equal(out, x)


def test_recognises_reducers_and_rejects_the_rest():
    module = parse_module("""HloModule m
max_s32 {
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  ROOT m = s32[] maximum(b, a)
}
not_a_reducer {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] subtract(a, b)
}
twice_a {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, a)
}
ENTRY e {
  ROOT p = f32[] parameter(0)
}
""")
    comps = {c.name: c for c in module.computations}
    assert Reduction.of(comps["max_s32"]) == Reduction(Opcode.MAXIMUM, T.S32)
    assert Reduction.of(comps["not_a_reducer"]) is None
    assert Reduction.of(comps["twice_a"]) is None


def test_one_computation_per_reduction_in_a_module():
    module = parse_module("HloModule m\nENTRY e {\n  ROOT p = f32[] parameter(0)\n}\n")
    add = Reduction(Opcode.ADD, T.F32)
    first = add.computation(module)
    assert add.computation(module) is first and first.name == "add.f32.reduction"
    assert Reduction.of(first) == add
    assert Reduction(Opcode.ADD, T.S32).computation(module) is not first
    assert module.computations[-1] is module.entry  # reducers come before their users
