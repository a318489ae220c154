"""Source spans: every instruction and computation the parser reads keeps where its name is
(file, line, column), the same on both parser paths; spans are never printed; clones keep them,
instructions a pass makes have none; diagnostics on parsed instructions say file:line:col from
them (not from searching the text again)."""

import pytest

from hlo_passes import parse_module, print_module
from hlo_passes.ir import Opcode, SourceSpan
from hlo_passes.ir.builder import Builder
from hlo_passes.ir.shape import ArrayShape
from hlo_passes.ir.types import PrimitiveType
from hlo_passes.parse.errors import HloParseError
from hlo_passes.verifier import verify_module

TEXT = """HloModule m, num_partitions=2

// a comment line
%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

ENTRY %main {
  %p = f32[4] parameter(0), sharding={replicated}
  %t = (f32[4], f32[4]) tuple(%p, %p)
  %n = f32[4] add(%p, f32[4] negate(%t#1))
  ROOT %r = f32[] reduce(%n, f32[] constant(0)), dimensions={0}, to_apply=%add
}
"""


def _spans(module) -> dict[str, tuple[int, int]]:
    return {i.name: (i.span.line, i.span.column) for c in module.computations for i in c.instructions} | {
        c.name: (c.span.line, c.span.column) for c in module.computations}


@pytest.mark.parametrize("engine", ["auto", "lark"])
def test_spans_point_at_names_on_both_paths(engine):
    module = parse_module(TEXT, "m.hlo", engine=engine)
    assert _spans(module) == {
        "add": (4, 1), "x": (5, 3), "y": (6, 3), "sum": (7, 8),
        "main": (10, 7), "p": (11, 3), "t": (12, 3),
        "negate.anon": (13, 30),  # a nested operand: its opcode
        "t_1": (13, 37),  # `%t#1`: the element XLA's parser makes of the reference
        "n": (13, 3), "constant.anon": (14, 36), "r": (14, 8),
    }
    assert {i.span.file for i in module.all_instructions()} == {"m.hlo"}
    assert str(module.entry.root.span) == "m.hlo:14:8"


def test_text_without_a_file_has_spans_without_one():
    module = parse_module(TEXT)
    assert module.entry.root.span == SourceSpan(None, 14, 8)
    assert str(module.entry.root.span) == "<input>:14:8"


def test_async_sugar_points_at_its_line():
    text = ("HloModule m\n\nENTRY e {\n  p = f32[4] parameter(0)\n"
            '  s = ((f32[4]), f32[4], s32[]) custom-call-start(p), custom_call_target="f"\n'
            "  ROOT d = f32[4] custom-call-done(s)\n}\n")
    module = parse_module(text, "a.hlo")
    start = next(i for i in module.all_instructions() if i.opcode is Opcode.ASYNC_START)
    wrapped = start.called["calls"]
    assert start.span == SourceSpan("a.hlo", 5, 3)
    assert wrapped.span == start.span and {i.span for i in wrapped.instructions} == {start.span}


def test_spans_are_not_printed():
    with_file = parse_module(TEXT, "some/where.hlo")
    without = parse_module(TEXT)
    for instr in without.all_instructions():
        instr.span = None
    assert print_module(with_file) == print_module(without) == print_module(parse_module(print_module(without)))


def test_clones_keep_spans_and_pass_made_instructions_have_none():
    module = parse_module(TEXT, "m.hlo")
    copy = module.clone()
    assert _spans(copy) == _spans(module)
    add = next(c for c in module.computations if c.name == "add")
    again = module.clone_computation(add)
    assert [i.span for i in again.instructions] == [i.span for i in add.instructions]
    assert again.span == add.span
    p = module.entry.parameters[0]
    made = Builder(module.entry, before=module.entry.root).op(
        Opcode.NEGATE, ArrayShape(PrimitiveType.F32, (4,)), [p])
    assert made.span is None


@pytest.mark.parametrize("engine", ["auto", "lark"])
def test_a_problem_found_after_reading_is_reported_at_the_nested_operand(engine):
    """The check after reading (shapes, per opcode) reports at the instruction's span.  It
    searched the text for `name =` before, and put a nested operand at its computation's name."""
    text = ("HloModule m\nENTRY e {\n  p = f32[4] parameter(0)\n  q = f32[5] parameter(1)\n"
            "  ROOT r = f32[4] add(p, f32[4] negate(q))\n}\n")
    with pytest.raises(HloParseError) as info:
        parse_module(text, "n.hlo", engine=engine)
    e = info.value
    assert (e.filename, e.line, e.column) == ("n.hlo", 5, 33)
    assert e.source_line == "  ROOT r = f32[4] add(p, f32[4] negate(q))"
    assert "'negate.anon' shape should be f32[5]" in e.message


@pytest.mark.parametrize("engine", ["auto", "lark"])
def test_second_root_is_reported_on_its_line(engine):
    """A second ROOT on a line the scanner hands to the grammar (a nested operand) was reported
    at line 1: its token's offset counted from the start of that line."""
    text = ("HloModule m\nENTRY e {\n  p = f32[4] parameter(0)\n  ROOT a = f32[4] negate(p)\n"
            "  ROOT b = f32[4] add(p, negate(p))\n}\n")
    with pytest.raises(HloParseError, match="more than one ROOT") as info:
        parse_module(text, engine=engine)
    assert (info.value.line, info.value.column) == (5, 8)


def test_verifier_errors_on_parsed_instructions_say_where():
    text = ("HloModule m\nENTRY e {\n  p = f32[4] parameter(0)\n  q = f32[5] parameter(1)\n"
            "  ROOT y = f32[4] add(p, q)\n}\n")
    (error,) = verify_module(parse_module(text, "v.hlo", check_semantics=False))
    assert error.span == SourceSpan("v.hlo", 5, 8)
    assert error.format().startswith("v.hlo:5:8: e/%y: operands must have the same dimensions")
