"""A parsed module stays small: the peak memory of parsing XLA-printed text is at most ~10x the
text's size (the front end's target in README), and the compact forms behind it behave like the
plain containers passes expect: a lone user kept without a set, shared empty `called` and
control-edge containers, one Attr slot per repeated attribute text."""

import tracemalloc

import pytest

from hlo_passes import parse_module, print_module
from hlo_passes.ir import OpMetadata

TEXT = """HloModule m

ENTRY e {
  p = f32[4] parameter(0)
  a = f32[4] add(p, p)
  b = f32[4] multiply(p, a)
  ROOT c = f32[4] subtract(b, a)
}
"""


def _dump(layers: int) -> str:
    """XLA-printed text shaped like a training step: chains of ops that repeat their metadata."""
    lines = ["HloModule step, entry_computation_layout={(f32[128,256]{1,0})->f32[128,256]{1,0}}", "",
             "ENTRY main {", "  p = f32[128,256]{1,0} parameter(0)"]
    prev = "p"
    for i in range(layers):
        meta = (f'metadata={{op_type="mul" op_name="jit(step)/layer{i}/mlp/mul" '
                f'source_file="/src/model.py" source_line={40 + i % 7}}}')
        lines += [f"  m.{i} = f32[128,256]{{1,0}} multiply({prev}, p), {meta}",
                  f"  a.{i} = f32[128,256]{{1,0}} add(m.{i}, {prev}), {meta}",
                  f"  t.{i} = f32[256,128]{{1,0}} transpose(a.{i}), dimensions={{1,0}}",
                  f"  n.{i} = f32[256,128]{{1,0}} negate(t.{i})",
                  f"  b.{i} = f32[128,256]{{1,0}} transpose(n.{i}), dimensions={{1,0}}"]
        prev = f"b.{i}"
    lines[-1] = "  ROOT " + lines[-1].lstrip()
    return "\n".join(lines + ["}", ""])


def _names(instrs) -> list[str]:
    return [i.name for i in instrs]


def test_peak_memory_of_a_parse_is_within_ten_times_the_text():
    text = _dump(2000)
    parse_module(text, engine="fast")  # grammar and readers built outside the measurement
    tracemalloc.start()
    try:
        module = parse_module(text, engine="fast")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(module.entry) == 10001
    assert peak < 10 * len(text), f"peak {peak / len(text):.1f}x the text's size"


def test_users_view_follows_every_edit():
    e = parse_module(TEXT).entry
    p, a, b, c = (e.find(n) for n in "pabc")
    assert _names(p.users) == ["a", "b"] and _names(a.users) == ["b", "c"] and _names(b.users) == ["c"]
    assert not c.users and len(c.users) == 0 and c in b.users and a not in b.users
    c.replace_operand(a, p)
    assert _names(a.users) == ["b"] and _names(p.users) == ["a", "b", "c"]
    b.set_operand(1, p)  # b uses p twice: one user
    assert not a.users and _names(p.users) == ["a", "b", "c"]
    e.remove(a)
    assert _names(p.users) == ["b", "c"]
    b.replace_all_uses_with(p)
    assert _names(p.users) == ["b", "c"] and c.operands == (p, p) and not b.users
    e.remove(b)
    assert _names(p.users) == ["c"]
    with pytest.raises(TypeError):
        p.users[0] = c  # read-only: edges change through the instruction's methods


def test_users_stay_in_order_as_they_grow_past_a_few_and_shrink():
    """A few users are kept in a tuple, many in an ordered set: the view is the same."""
    from hlo_passes.ir.instruction import FEW_USERS

    n = FEW_USERS + 4
    lines = [f"  v{k} = f32[4] negate(p)" for k in range(n)]
    m = parse_module("HloModule m\n\nENTRY e {\n  p = f32[4] parameter(0)\n" + "\n".join(lines)
                     + f"\n  ROOT t = tuple({', '.join(f'v{k}' for k in range(n))})\n}}\n")
    e = m.entry
    p = e.find("p")
    assert _names(p.users) == [f"v{k}" for k in range(n)]
    for k in (0, 5, n - 1):
        e.find("t").replace_operand(e.find(f"v{k}"), p)
        e.remove(e.find(f"v{k}"))
    expected = [f"v{k}" for k in range(n) if k not in (0, 5, n - 1)] + ["t"]
    assert _names(p.users) == expected
    q = e.find("v1")
    for k in range(2, n - 1):  # v1 (used by t) gains users one by one, past FEW_USERS
        if k != 5:
            e.find(f"v{k}").replace_operand(p, q)
    assert _names(q.users) == ["t"] + [f"v{k}" for k in range(2, n - 1) if k != 5]
    assert len(q.users) > FEW_USERS
    with pytest.raises((TypeError, AttributeError)):
        q.users[0] = p  # type: ignore[index]  # read-only in every form


def test_empty_called_and_control_edges_are_shared_and_read_only():
    m = parse_module(TEXT)
    a, b, c = (m.entry.find(n) for n in "abc")
    assert dict(a.called) == {} and not a.control_predecessors and not a.control_successors
    with pytest.raises(TypeError):
        a.called["to_apply"] = m.entry  # give the instruction a dict of its own instead
    b.add_control_predecessor(a)
    assert b.control_predecessors == [a] and a.control_successors == [b]
    assert not c.control_predecessors and not c.control_successors and not b.control_successors
    assert "control-predecessors={a}" in print_module(m)
    b.drop_operands()
    assert not b.control_predecessors and not a.control_successors


def test_attributes_of_an_instruction_without_any_behave_as_a_dict():
    """An instruction without attributes holds no dict; its `attributes` still reads and writes
    like one, and a view taken before a write sees the write."""
    from hlo_passes.ir import Attr

    m = parse_module(TEXT)
    a, b, c = (m.entry.find(n) for n in "abc")
    assert a._attributes is None and not a.attributes and len(a.attributes) == 0
    assert "x" not in a.attributes and a.attributes.get("x", 3) == 3 and list(a.attributes.items()) == []
    with pytest.raises(KeyError):
        a.attributes["x"]
    view = a.attributes
    a.set_attr("dimensions", (0,))
    assert "dimensions" in view and dict(view) == dict(a.attributes) and a._attributes is not None
    b.attributes["metadata"] = Attr(raw='{op_name="b"}')
    c.attributes.update({"metadata": Attr(raw='{op_name="c"}')})
    assert b.metadata.op_name == "b" and c.metadata.op_name == "c"
    assert c.attributes.pop("metadata").raw == '{op_name="c"}' and c.attributes.pop("metadata", None) is None
    assert c.attributes.setdefault("metadata", Attr(raw='{op_name="d"}')).raw == '{op_name="d"}'
    del c.attributes["metadata"]
    c.attributes.clear()
    assert not c.attributes and print_module(m).count("metadata") == 1
    fresh = m.entry.find("p")
    fresh.remove_attr("sharding")  # nothing to remove: no dict made
    assert fresh._attributes is None and not fresh.has_attr("sharding") and fresh.sharding is None


def test_repeated_attribute_texts_share_one_slot_and_stay_independent():
    m = parse_module(_dump(3))
    slots = {id(i.attributes["metadata"]) for i in m.entry.instructions if i.has_attr("metadata")}
    assert len(slots) == 3  # m.i and a.i of each layer carry the same text
    m0, a0 = m.entry.find("m.0"), m.entry.find("a.0")
    assert m0.attributes["metadata"] is a0.attributes["metadata"]
    m0.set_attr("metadata", m0.metadata.with_fields(op_name="renamed"))
    assert a0.metadata.op_name == "jit(step)/layer0/mlp/mul" and m0.metadata.op_name == "renamed"
    assert isinstance(a0.metadata, OpMetadata)
    assert 'op_name="renamed"' in print_module(m)


def test_names_of_a_parsed_module_stay_taken():
    m = parse_module(TEXT)
    assert m.names.unique("a") == "a.1" and m.names.unique("q") == "q"
    assert m.computation_names.unique("e") == "e.1"
