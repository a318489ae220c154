"""Shape inference agrees with XLA's, opcode by opcode: an instruction written without its
shape is read by both parsers or refused by both, and where both read it, XLA's canonical
print of our output equals its print of the input (same shapes, same layouts)."""

import pytest

from hlo_passes import HloParseError, parse_module, print_module
from hlo_passes.ir.opcode import ELEMENTWISE_BINARY, ELEMENTWISE_UNARY, Opcode
from hlo_passes.verifier.shape_rules import INFERABLE
from tests.frontend.xla_oracle import xla_canonical

_INT_OPS = {Opcode.CLZ, Opcode.NOT, Opcode.POPCNT, Opcode.SHIFT_LEFT, Opcode.SHIFT_RIGHT_ARITHMETIC,
            Opcode.SHIFT_RIGHT_LOGICAL, Opcode.AND, Opcode.OR, Opcode.XOR, Opcode.MULHI}
_COMPLEX_OPS = {Opcode.REAL, Opcode.IMAG}


def _element_type(op: Opcode) -> str:
    return "s32" if op in _INT_OPS else "c64" if op in _COMPLEX_OPS else "f32"


def _module(op: Opcode, arity: int) -> str:
    t = _element_type(op)
    operands = ", ".join(["p"] * arity)
    attrs = ", direction=GT" if op is Opcode.COMPARE else ""
    return f"HloModule m\n\nENTRY e {{\n  p = {t}[3,2]{{0,1}} parameter(0)\n  ROOT r = {op.value}({operands}){attrs}\n}}\n"


def _xla(text: str) -> str | None:
    try:
        return xla_canonical(text)
    except Exception:  # noqa: BLE001 - XLA refused it
        return None


def _ours(text: str) -> str | None:
    try:
        return print_module(parse_module(text))
    except HloParseError:
        return None


CASES = [(op, 1) for op in sorted(ELEMENTWISE_UNARY, key=lambda o: o.value)]
CASES += [(op, 2) for op in sorted(ELEMENTWISE_BINARY, key=lambda o: o.value)]


@pytest.mark.parametrize("op,arity", CASES, ids=[op.value for op, _ in CASES])
def test_elementwise_inference_agrees_with_xla(op, arity):
    text = _module(op, arity)
    expected, ours = _xla(text), _ours(text)
    assert (ours is None) == (expected is None), f"{op.value}: XLA {'reads' if expected else 'refuses'} it"
    if ours is not None:
        assert xla_canonical(ours) == expected
    assert (op in INFERABLE) == (expected is not None)


NOT_INFERRED = {
    "reshape": "ROOT r = reshape(p)",
    "iota": "ROOT r = iota(), iota_dimension=0",
    "slice": "ROOT r = slice(p), slice={[0:1], [0:2]}",
    "dynamic-slice": "i = s32[] constant(0)\n  ROOT r = dynamic-slice(p, i, i), dynamic_slice_sizes={1,1}",
    "custom-call": 'ROOT r = custom-call(p), custom_call_target="f"',
    "parameter": "ROOT r = parameter(1)",
    "opt-barrier": "ROOT r = opt-barrier(p)",
    "all-reduce": "ROOT r = all-reduce(p), to_apply=e",
}


@pytest.mark.parametrize("name", sorted(NOT_INFERRED))
def test_opcodes_xla_does_not_infer_need_a_shape(name):
    text = f"HloModule m\n\nENTRY e {{\n  p = f32[3,2] parameter(0)\n  {NOT_INFERRED[name]}\n}}\n"
    assert _xla(text) is None
    with pytest.raises(HloParseError) as info:
        parse_module(text)
    assert "infer" in info.value.message or "not defined" in info.value.message, info.value.format()


def test_inferred_broadcast_reads_dimensions_as_sizes_like_xla():
    """XLA infers broadcast(x), dimensions={2} as f32[2,3] for x: f32[3] (the dimensions are read
    as new major sizes); the verifier then refuses that broadcast, as XLA's verifier does."""
    text = "HloModule m\n\nENTRY e {\n  x = f32[3] parameter(0)\n  ROOT b = broadcast(x), dimensions={2}\n}\n"
    assert "f32[2,3]{1,0} broadcast" in _xla(text)
    module = parse_module(text, check_semantics=False)
    assert module.entry.root.shape.to_hlo(False) == "f32[2,3]"
    with pytest.raises(HloParseError, match="broadcast dimension|one result dimension"):
        parse_module(text)
