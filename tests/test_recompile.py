"""Compiled modules as fresh programs (runtime/recompile.py): a bitcast becomes the logical ops
that move the same bytes, fusions become calls, asynchronous pairs become the synchronous op,
layouts and the schedule are dropped, and what has no equivalent is refused by name."""

import numpy as np
import pytest

from hlo_passes import parse_module, print_module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.runtime import VerificationError, execute_module, verify_equivalent
from hlo_passes.runtime.recompile import (NotRecompilable, as_fresh_program, bitcast_plan, make_fresh_program,
                                          needs_fresh_program)


def physical_view(buffer: np.ndarray, dims, minor_to_major) -> np.ndarray:
    """The logical array that a layout makes of a flat buffer: strides from the layout, no copies."""
    strides = [0] * len(dims)
    step = buffer.itemsize
    for d in minor_to_major:
        strides[d] = step
        step *= dims[d]
    return np.lib.stride_tricks.as_strided(buffer, shape=tuple(dims), strides=tuple(strides))


def layout_text(m2m) -> str:
    return "{" + ",".join(map(str, m2m)) + "}"


# (source dims, source layout, target dims, target layout): what each case guards.
BITCASTS = [
    ((4, 6), (1, 0), (2, 12), (1, 0)),              # row-major on both sides: a plain reshape
    ((4, 6), (0, 1), (6, 4), (1, 0)),               # column-major → row-major of the swapped dims: a transpose
    ((2, 3, 4), (0, 2, 1), (4, 6), (0, 1)),         # transposes on both sides around a reshape
    ((2, 3, 4), (2, 0, 1), (3, 8), (1, 0)),         # the source's physical order, merged
    ((6, 4), (1, 0), (2, 3, 4), (1, 2, 0)),         # row-major source split into a laid-out target
    ((5,), (0,), (1, 5, 1), (0, 2, 1)),             # degenerate dims
]


@pytest.mark.parametrize("src,src_layout,dst,dst_layout", BITCASTS)
def test_bitcast_equals_numpy_reinterpretation(src, src_layout, dst, dst_layout):
    buffer = np.arange(int(np.prod(src)), dtype=np.float32) * 1.5 - 7
    x = np.ascontiguousarray(physical_view(buffer, src, src_layout))
    want = physical_view(buffer, dst, dst_layout)
    text = f"""HloModule bitcast, is_scheduled=true
ENTRY e {{
  x = f32[{",".join(map(str, src))}]{layout_text(src_layout)} parameter(0)
  ROOT b = f32[{",".join(map(str, dst))}]{layout_text(dst_layout)} bitcast(x)
}}
"""
    (got,) = execute_module(text, [x])
    np.testing.assert_array_equal(got, want)


def test_bitcast_between_element_types_is_a_bitcast_convert():
    buffer = np.array([1.0, -2.5, 3.25, 0.0, 7.0, -0.5], dtype=np.float32)
    x = np.ascontiguousarray(physical_view(buffer, (2, 3), (0, 1)))
    text = """HloModule bitcast
ENTRY e {
  x = f32[2,3]{0,1} parameter(0)
  ROOT b = s32[6]{0} bitcast(x)
}
"""
    (got,) = execute_module(text, [x])
    np.testing.assert_array_equal(got, buffer.view(np.int32))


def test_bitcast_plan_leaves_out_identities():
    m = parse_module("HloModule m\nENTRY e {\n  x = f32[4,6]{1,0} parameter(0)\n  ROOT b = f32[24]{0} bitcast(x)\n}\n")
    b = m.entry.root
    assert bitcast_plan(b.operands[0].shape, b.shape) == [("reshape", (24,))]
    m = parse_module("HloModule m\nENTRY e {\n  x = f32[4,6]{0,1} parameter(0)\n  ROOT b = f32[6,4]{1,0} bitcast(x)\n}\n")
    b = m.entry.root
    assert bitcast_plan(b.operands[0].shape, b.shape) == [("transpose", (1, 0))]


FUSED = """HloModule fused, is_scheduled=true, entry_computation_layout={(f32[4,6]{0,1})->(f32[6,4]{1,0}, f32[4,6]{1,0})}

fc {
  p = f32[4,6]{0,1} parameter(0)
  ROOT e = f32[4,6]{0,1} exponential(p)
}

dc {
  p = f32[4,6]{1,0} parameter(0)
  ROOT n = f32[4,6]{1,0} negate(p)
}

ENTRY e {
  x = f32[4,6]{0,1} parameter(0)
  f = f32[4,6]{0,1} fusion(x), kind=kLoop, calls=fc
  b = f32[6,4]{1,0} bitcast(f)
  cs = (f32[4,6]{1,0}, f32[4,6]{1,0}, u32[]) copy-start(x)
  cd = f32[4,6]{1,0} copy-done(cs)
  y = f32[4,6]{1,0} fusion(cd), kind=kCustom, calls=dc, backend_config={"fusion_config":{"kind":"__ynn_fusion"}}
  ROOT t = (f32[6,4]{1,0}, f32[4,6]{1,0}) tuple(b, y)
}
"""


def test_compiled_module_becomes_a_fresh_program():
    m = parse_module(FUSED)
    assert needs_fresh_program(m)
    assert make_fresh_program(m)
    assert not needs_fresh_program(m)
    text = print_module(m)
    assert "is_scheduled" not in text and "entry_computation_layout" not in text
    assert all(leaf.layout is None for i in m.all_instructions() for leaf in i.shape.leaves())
    assert "cd = f32[4,6] copy(x)" in text
    opcodes = {i.opcode for i in m.all_instructions()}
    assert Opcode.FUSION not in opcodes and Opcode.BITCAST not in opcodes and Opcode.COPY_START not in opcodes
    assert "backend_config" not in text and "kind=" not in text
    x = np.arange(24, dtype=np.float32).reshape(4, 6) / 10
    got = execute_module(FUSED, [x])
    np.testing.assert_allclose(got[0], np.exp(x).T, rtol=1e-6)
    np.testing.assert_array_equal(got[1], -x)


def test_fresh_program_text_is_untouched_when_nothing_needs_it():
    plain = "HloModule m\nENTRY e {\n  x = f32[4] parameter(0)\n  ROOT n = f32[4] negate(x)\n}\n"
    assert as_fresh_program(plain) == plain


def test_async_collectives_become_synchronous():
    text = """HloModule m, is_scheduled=true, replica_count=2

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY e {
  x = f32[4]{0} parameter(0)
  ars = f32[4]{0} all-reduce-start(x), replica_groups={{0,1}}, to_apply=add
  ard = f32[4]{0} all-reduce-done(ars)
  ags = (f32[4]{0}, f32[8]{0}) all-gather-start(ard), replica_groups={{0,1}}, dimensions={0}
  ROOT agd = f32[8]{0} all-gather-done(ags)
}
"""
    fresh = parse_module(as_fresh_program(text))
    assert [i.opcode for i in fresh.entry.post_order()] == [Opcode.PARAMETER, Opcode.ALL_REDUCE, Opcode.ALL_GATHER]
    sync = text.replace("all-reduce-start", "all-reduce").replace("  ard = f32[4]{0} all-reduce-done(ars)\n", "")
    sync = sync.replace("all-gather-start(ard)", "all-gather(ars)").replace("(f32[4]{0}, f32[8]{0}) all-gather",
                                                                           "f32[8]{0} all-gather")
    sync = sync.replace("  ROOT agd = f32[8]{0} all-gather-done(ags)\n", "").replace("  ags = ", "  ROOT ags = ")
    report = verify_equivalent(sync, text)
    assert report.ok, report.format()


def test_send_and_recv_are_refused_by_name():
    text = """HloModule m, is_scheduled=true
ENTRY e {
  x = f32[4]{0} parameter(0)
  tok = token[] after-all()
  s = (f32[4]{0}, u32[], token[]) send(x, tok), channel_id=1
  sd = token[] send-done(s), channel_id=1
  ROOT n = f32[4]{0} negate(x)
}
"""
    with pytest.raises(VerificationError, match="s: a send cannot run"):
        execute_module(text, [np.zeros(4, np.float32)])


def test_tiled_layout_bitcast_is_refused():
    m = parse_module("HloModule m\nENTRY e {\n  x = f32[8,128]{1,0:T(8,128)} parameter(0)\n"
                     "  ROOT b = f32[1024]{0} bitcast(x)\n}\n")
    with pytest.raises(NotRecompilable, match="b: a bitcast of the tiled layout"):
        make_fresh_program(m)
