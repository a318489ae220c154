"""IR invariants: use-def chains stay exact through every mutation, names stay
unique, erasing a used instruction is an error, clones are independent."""

from pathlib import Path

import pytest

from hlo_passes import parse_module, print_module
from hlo_passes.ir import IRError, Opcode
from hlo_passes.ir.builder import Builder, reduction_computation
from tests.frontend.xla_oracle import xla_canonical

TEXT = """HloModule m

ENTRY e {
  p = f32[4] parameter(0)
  q = f32[4] parameter(1)
  a = f32[4] add(p, q)
  m = f32[4] multiply(a, a)
  ROOT n = f32[4] negate(m)
}
"""


def users(instr):
    return sorted(u.name for u in instr.users)


def test_users_are_tracked_from_parse():
    m = parse_module(TEXT)
    e = m.entry
    a, mul = e.find("a"), e.find("m")
    assert users(e.find("p")) == ["a"] and users(a) == ["m"]
    assert mul.operands == (a, a)


def test_replace_all_uses_with_updates_users_and_root():
    m = parse_module(TEXT)
    e = m.entry
    a, mul, n = e.find("a"), e.find("m"), e.find("n")
    b = Builder(e, before=mul)
    s = b.subtract(e.find("p"), e.find("q"))
    a.replace_all_uses_with(s)
    assert mul.operands == (s, s) and not a.users and users(s) == ["m"]
    e.remove(a)
    assert users(e.find("p")) == ["subtract"]
    n.replace_all_uses_with(mul)
    assert e.root is mul
    e.remove(n)
    out = print_module(m)
    assert "ROOT m = f32[4] multiply(subtract, subtract)" in out
    xla_canonical(out)


def test_erasing_a_used_instruction_is_an_error():
    m = parse_module(TEXT)
    with pytest.raises(IRError, match="still used by m"):
        m.entry.remove(m.entry.find("a"))
    with pytest.raises(IRError, match="root"):
        m.entry.remove(m.entry.root)


def test_new_names_are_unique_and_old_names_kept():
    m = parse_module(TEXT)
    e = m.entry
    b = Builder(e, before=e.root)
    x = b.add(e.find("p"), e.find("q"))
    y = b.add(x, x)
    assert (x.name, y.name) == ("add", "add.1")
    z = b.op(Opcode.NEGATE, x.shape, [y], name="a")
    assert z.name == "a.1"
    assert [i.name for i in e.instructions][:5] == ["p", "q", "a", "m", "add"]


def test_builder_collectives_and_reductions_print_valid_hlo():
    m = parse_module(TEXT)
    e = m.entry
    b = Builder(e, before=e.root, metadata=e.find("m").attributes.get("metadata"))
    from hlo_passes.ir import ReplicaGroups

    red = reduction_computation(m, "add", e.find("p").shape.element_type)
    ar = b.all_reduce([e.find("m")], ReplicaGroups.explicit([[0]]), red)
    e.root.replace_operand(e.find("m"), ar)
    assert reduction_computation(m, "add", e.find("p").shape.element_type) is red
    xla_canonical(print_module(m))


def test_clone_computation_is_independent():
    m = parse_module(TEXT)
    clone = m.clone_computation(m.entry)
    assert clone.root is not m.entry.root
    assert {i.name for i in clone.instructions}.isdisjoint({i.name for i in m.entry.instructions})
    assert all(op.parent is clone for i in clone.instructions for op in i.operands)


def test_entry_layout_is_rebuilt_when_the_signature_changes():
    text = TEXT.replace("HloModule m", "HloModule m, entry_computation_layout={(f32[4]{0}, f32[4]{0})->f32[4]{0}}")
    m = parse_module(text)
    assert print_module(m).startswith("HloModule m, entry_computation_layout={(f32[4]{0}, f32[4]{0})->f32[4]{0}}")
    for p in m.entry.parameters:
        p.shape = p.shape.with_dims((2,))
    for name in "amn":
        m.entry.find(name).shape = m.entry.find(name).shape.with_dims((2,))
    out = print_module(m)
    assert "entry_computation_layout={(f32[2]{0}, f32[2]{0})->f32[2]{0}}" in out
    xla_canonical(out)


def test_literal_values_round_trip():
    m = parse_module("HloModule m\nENTRY e {\n  ROOT c = s32[2,2] constant({ {1, 2}, {3, 4} })\n}\n")
    values = m.entry.root.literal_value()
    assert values.tolist() == [[1, 2], [3, 4]]
    b = Builder(m.entry)
    c = b.constant_from_array(values * 2, m.entry.root.shape.element_type)
    assert c.literal_value().tolist() == [[2, 4], [6, 8]]


def test_fresh_names_are_never_element_types():
    """XLA's lexer reads `s1`, `f32`, `token` as element types, so a pass that asks for one of
    them as a name gets a numbered variant, which XLA's parser accepts."""
    from hlo_passes.ir.module import NameTable

    table = NameTable()
    assert [table.unique(h) for h in ("s1", "f32", "token", "add")] == ["s1.1", "f32.1", "token.1", "add"]


def test_a_name_table_that_folds_its_changes_into_its_list_answers_as_one_that_does_not():
    """A NameTable folds the names added and released since it read its names into its sorted
    list once they are many; a table folding after every change and one never folding hand out
    the same names and agree on every name, through releases, reservations and numbering."""
    import random

    from hlo_passes.ir.module import NameTable

    class Folding(NameTable):
        _FOLD_MIN, _FOLD_FRACTION = 0, 10**9  # fold after every change

    class Never(NameTable):
        _FOLD_MIN = 10**9

    rng = random.Random(7)
    start = [f"n.{k}" for k in range(0, 60, 2)] + ["a", "b.3"]
    tables = [cls(lambda: iter(start)) for cls in (Folding, Never)]
    pool = [f"n.{k}" for k in range(70)] + ["n", "a", "a.1", "b", "b.3", "c"]
    for step in range(600):
        name, op = rng.choice(pool), rng.choice(("unique", "reserve", "release"))
        results = [getattr(t, op)(name) for t in tables]
        assert results[0] == results[1], (step, op, name)
        assert [name in t for t in tables] == [name in tables[1]] * 2
    assert [p for p in pool if p in tables[0]] == [p for p in pool if p in tables[1]]


def test_module_clone_is_deep_and_prints_the_same():
    """Module.clone copies computations, instructions, use-def and control edges and callees; a
    change to the copy never shows in the original, and both print the same text until then."""
    from hlo_passes import parse_module, print_module
    from hlo_passes.ir.opcode import Opcode

    text = """HloModule m
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}
ENTRY e {
  p = f32[8] parameter(0)
  n = f32[8] negate(p)
  z = f32[] constant(0)
  r = f32[] reduce(n, z), dimensions={0}, to_apply=add
  ROOT t = (f32[8], f32[]) tuple(n, r), control-predecessors={r}
}
"""
    original = parse_module(text)
    copy = original.clone()
    assert print_module(copy) == print_module(original)
    reduce_ = next(i for i in copy.all_instructions() if i.opcode is Opcode.REDUCE)
    assert reduce_.called["to_apply"] in copy.computations
    assert reduce_.called["to_apply"] not in original.computations
    assert copy.entry.root.control_predecessors[0] is reduce_
    negate = next(i for i in copy.all_instructions() if i.opcode is Opcode.NEGATE)
    negate.opcode = Opcode.ABS
    assert "negate(p)" in print_module(original) and "abs(p)" in print_module(copy)
    assert copy.names.unique("n") != "n"  # the copy's name table knows its names


def _structure(module) -> list:
    """Everything a module holds, by name (object identity only for the immutable values a
    clone shares: attribute slots, shapes), in every order the IR keeps: instructions, users,
    operands, control edges, parameters, computations."""
    def names(instrs):
        return [i.name for i in instrs]

    out: list = [module.name, list(module.attributes.items()), module.tables, module.style,
                 module.parsed_entry_signature, module.entry.name if module.entry else None]
    for comp in module.computations:
        assert comp.module is module
        out.append((comp.name, comp.is_entry, list(comp.attributes.items()), comp.print_signature, comp.span,
                    names(comp.parameters), comp.root.name if comp.root else None))
        for i in comp.instructions:
            assert i.parent is comp
            out.append((i.name, i.opcode, id(i.shape), names(i.operands), names(i.users),
                        [(k, id(v)) for k, v in i.attributes.items()],
                        {k: [c.name for c in (v if isinstance(v, tuple) else (v,))] for k, v in i.called.items()},
                        i.literal, i.parameter_number, i.span, names(i.control_predecessors),
                        names(i.control_successors)))
    return out


def test_restoring_a_snapshot_gives_what_a_clone_gives():
    """`Module.snapshot` keeps a module compactly for rollback; restoring it must build what a
    `clone()` taken at the same time holds, in every order the IR keeps (users included),
    also for a module with insertions still pending and erased instructions."""
    from hlo_passes.ir.instruction import Instruction

    text = """HloModule m, entry_computation_layout={(f32[8]{0})->(f32[8]{0}, f32[])}
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}
ENTRY e {
  p = f32[8] parameter(0)
  n = f32[8] negate(p), metadata={op_name="x" source_file="m.py" source_line=3}
  e = f32[8] exponential(p)
  z = f32[] constant(0)
  r = f32[] reduce(n, z), dimensions={0}, to_apply=add
  s = f32[8] add(n, e), sharding={devices=[2]0,1}
  ROOT t = (f32[8], f32[]) tuple(s, r), control-predecessors={r}
}
"""
    module = parse_module(text, "m.hlo")
    entry = module.entry
    n, e, s = entry.find("n"), entry.find("e"), entry.find("s")
    entry.add(Instruction(Opcode.ABS, n.shape, [n], name="before_s"), before=s)
    entry.add(Instruction(Opcode.SIN, n.shape, [e], name="after_n"), after=n)
    s.replace_operand(e, entry.find("after_n"))
    entry.add(Instruction(Opcode.COS, n.shape, [p := entry.find("p")], name="gone"), after=p)
    entry.remove(entry.find("gone"))
    s.add_control_predecessor(n)  # pending insertions are not folded before the snapshot
    expected = _structure(module.clone())
    snapshot = module.snapshot()
    before = print_module(module)
    entry.root = entry.add(Instruction(Opcode.TUPLE, entry.root.shape, entry.root.operands, name="t2"))
    entry.find("r").set_attr("dimensions", (0,))
    module.computations[0].root.opcode = Opcode.MULTIPLY
    holder = module
    module.restore(snapshot)
    assert module is holder
    assert _structure(module) == expected
    assert print_module(module) == before


def test_a_trial_hands_out_names_and_channels_as_a_clone_and_leaves_no_trace():
    """`Module.trial` (weight-update-sharding prices its rewrite so, instead of a clone): inside,
    new names and channel ids are those a fresh clone would give; afterwards the module is
    what a clone taken before holds, and later names and channel ids are those it would have
    given without the trial, even where its tables had numbered past a released name."""
    from hlo_passes.ir.instruction import Instruction

    text = """HloModule m
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}
ENTRY e {
  p = f32[8] parameter(0)
  n = f32[8] negate(p)
  ar = f32[8] all-reduce(n), channel_id=3, replica_groups={}, to_apply=add
  ROOT s = f32[8] add(n, ar)
}
"""

    def grown(module):
        """Names `n.1`, `n.2`, then `n.1` released: a table that numbered past it goes on to `n.3`."""
        entry = module.entry
        for _ in range(2):
            entry.add(Instruction(Opcode.ABS, entry.find("p").shape, [entry.find("p")]), name_hint="n")
        entry.remove(entry.find("n.1"))
        module.names.release("n.1")
        module.new_channel_id()
        return module

    def outcome(module):
        entry = module.entry
        made = entry.add(Instruction(Opcode.SIN, entry.find("p").shape, [entry.find("p")]), name_hint="n")
        return made.name, module.new_channel_id()

    module = grown(parse_module(text))
    expected_inside = outcome(module.clone())
    expected_after = outcome(grown(parse_module(text)))
    before, structure = print_module(module), _structure(module.clone())
    with module.trial() as trial:
        assert trial is module
        assert outcome(trial) == expected_inside == ("n.1", 4)
        trial.entry.find("n").opcode = Opcode.ABS
    assert print_module(module) == before
    assert _structure(module) == structure
    assert outcome(module) == expected_after == ("n.3", 5)


def test_a_trial_of_some_computations_refills_them_and_leaves_the_others_as_they_are():
    """`Module.trial(changing)` keeps only the computations the block may change: afterwards
    those are the same computation objects, refilled as a clone's; the others are untouched
    objects; computations added inside are gone, removed ones are back, and the header is
    as it was."""
    from hlo_passes.ir.computation import Computation
    from hlo_passes.ir.instruction import Instruction

    text = """HloModule m, num_partitions=2
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}
body {
  x = f32[8] parameter(0)
  ROOT y = f32[8] negate(x)
}
unused {
  u = f32[8] parameter(0)
  ROOT v = f32[8] abs(u)
}
ENTRY e {
  p = f32[8] parameter(0)
  n = f32[8] call(p), to_apply=body
  ar = f32[8] all-reduce(n), channel_id=3, replica_groups={}, to_apply=add
  ROOT s = f32[8] add(n, ar)
}
"""
    module = parse_module(text)
    before, structure = print_module(module), _structure(module.clone())
    entry, add, body, unused = (module.computation(n) for n in ("e", "add", "body", "unused"))
    untouched = {c.name: (c, c.instructions) for c in (add, body, unused)}
    with module.trial([entry]) as trial:
        trial.entry.find("n").opcode = Opcode.ABS
        p = trial.entry.find("p")
        trial.entry.add(Instruction(Opcode.SIN, p.shape, [p]), name_hint="n")
        trial.remove_computation(unused)
        extra = Computation("extra")
        extra.root = extra.add(Instruction(Opcode.PARAMETER, p.shape, parameter_number=0, name="q"))
        trial.add_computation(extra)
        trial.set_header_attr("num_partitions", 4)
    assert print_module(module) == before
    assert _structure(module) == structure
    assert module.entry is entry and module.computation("e") is entry
    for name, (comp, instructions) in untouched.items():
        assert module.computation(name) is comp and comp.instructions == instructions
    assert module.entry.find("ar").called["to_apply"] is add


@pytest.mark.parametrize("case", sorted((Path(__file__).parent.parent / "golden" / "corpus").glob("*/*.hlo")),
                         ids=lambda p: p.name)
def test_restoring_a_snapshot_of_a_corpus_program_gives_what_a_clone_gives(case):
    module = parse_module(case.read_text(), str(case))
    expected = _structure(module.clone())
    snapshot = module.snapshot()
    module.restore(snapshot)
    assert _structure(module) == expected


def test_replace_moves_users_root_and_control_edges_both_ways():
    from hlo_passes import parse_module
    from hlo_passes.ir.instruction import Instruction
    from hlo_passes.ir.opcode import Opcode

    module = parse_module("""HloModule m
ENTRY e {
  p = f32[4] parameter(0)
  a = f32[4] exponential(p)
  b = f32[4] negate(p), control-predecessors={a}
  c = f32[4] abs(p), control-predecessors={b}
  ROOT t = (f32[4], f32[4]) tuple(b, c)
}
""")
    comp = module.entry
    a, b, c = (next(i for i in comp.instructions if i.name == n) for n in "abc")
    new = Instruction(Opcode.SIN, b.shape, [b.operands[0]], name="s")
    comp.replace(b, new)
    assert b.parent is None and new in comp
    assert list(new.control_predecessors) == [a] and list(a.control_successors) == [new]
    assert list(c.control_predecessors) == [new]
    assert comp.root.operands[0] is new


def test_merging_two_instructions_ordered_by_a_control_edge_leaves_no_self_edge():
    """Two instructions replaced by one (a combiner's merge): the edge between them is dropped,
    not turned into an edge from the merged instruction to itself; outside edges move."""
    from hlo_passes.ir.instruction import Instruction
    from hlo_passes.passes.collectives.common import replace_members

    module = parse_module("""HloModule m
ENTRY e {
  p = f32[4] parameter(0)
  z = f32[4] exponential(p)
  a = f32[4] negate(p), control-predecessors={z}
  b = f32[4] abs(p), control-predecessors={a}
  c = f32[4] sine(p), control-predecessors={b}
  ROOT t = (f32[4], f32[4], f32[4]) tuple(a, b, c)
}
""")
    comp = module.entry
    z, a, b, c = (next(i for i in comp.instructions if i.name == n) for n in "zabc")
    merged = comp.add(Instruction(Opcode.COS, a.shape, [p := a.operands[0]], name="m"), before=a)
    replace_members(comp, [a, b], merged, [merged, merged])
    assert list(merged.control_predecessors) == [z] and list(merged.control_successors) == [c]
    assert list(z.control_successors) == [merged] and list(c.control_predecessors) == [merged]
    assert p.users and parse_module(print_module(module)).entry.root.operands[0].name == "m"


def test_insertion_order_matches_a_plain_list_under_random_edits():
    """Insertions before/after an instruction are folded into the order lazily; after any mix
    of appends, insertions next to new or old instructions and removals, the order is the one a
    plain list with list.insert gives."""
    import random

    from hlo_passes.ir.computation import Computation
    from hlo_passes.ir.instruction import Instruction
    from hlo_passes.ir.opcode import Opcode
    from hlo_passes.ir.shape import ArrayShape
    from hlo_passes.ir.types import PrimitiveType

    scalar = ArrayShape(PrimitiveType.F32, ())
    for seed in range(200):
        rng = random.Random(seed)
        comp = Computation("c")
        reference: list[Instruction] = []
        for k in range(rng.randint(1, 40)):
            instr = Instruction(Opcode.CONSTANT, scalar, name=f"c{k}", literal="0")
            where = rng.random()
            if not reference or where < 0.3:
                comp.add(instr)
                reference.append(instr)
            elif where < 0.65:
                anchor = rng.choice(reference)
                comp.add(instr, before=anchor)
                reference.insert(reference.index(anchor), instr)
            elif where < 0.9:
                anchor = rng.choice(reference)
                comp.add(instr, after=anchor)
                reference.insert(reference.index(anchor) + 1, instr)
            else:
                victim = rng.choice(reference)
                comp.remove(victim)
                reference.remove(victim)
            assert len(comp) == len(reference)
            if rng.random() < 0.2:  # reading folds what is pending; later edits go on from there
                assert comp.instructions == reference, seed
        assert comp.instructions == reference, seed
        assert all(i in comp for i in reference)


CONTROL_FLOW = """HloModule cf

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

neg {
  x = f32[4] parameter(0)
  ROOT n = f32[4] negate(x)
}

ENTRY e {
  p = f32[4] parameter(0)
  k = s32[] parameter(1)
  z = f32[] constant(0)
  r = f32[] reduce(p, z), dimensions={0}, to_apply=add
  c = f32[4] conditional(k, p, p), branch_computations={neg, neg}
  ROOT t = (f32[], f32[4]) tuple(r, c)
}
"""


def test_typed_views_of_shapes_and_called_computations():
    # What passes read instead of narrowing `shape` and `called` themselves: the array shape where
    # an op has one, the one computation under a key, a conditional's branches in either spelling.
    m = parse_module(CONTROL_FLOW)
    e = m.entry
    assert e.find("p").array_shape.dims == (4,)
    with pytest.raises(TypeError, match="t: expected an array shape, got \\(f32\\[\\], f32\\[4\\]\\)"):
        e.root.array_shape
    assert e.find("r").called_computation("to_apply") is m.computation("add")
    neg = m.computation("neg")
    assert e.find("c").branch_computations == (neg, neg)
    with pytest.raises(TypeError, match="c: branch_computations names 2 computations, expected one"):
        e.find("c").called_computation("branch_computations")
    predicated = parse_module(CONTROL_FLOW.replace("k = s32[] parameter(1)", "k = pred[] parameter(1)").replace(
        "branch_computations={neg, neg}", "true_computation=neg, false_computation=neg"))
    pneg = predicated.computation("neg")
    assert predicated.entry.find("c").branch_computations == (pneg, pneg)


def test_a_shape_cut_to_a_scalar_prints_as_xla_parses_it():
    """A rank-0 shape made from a laid-out array keeps an empty layout, which prints as no braces
    (XLA's parser rejects `f32[]{}`, and so does ours); a scalar's memory space still prints."""
    laid_out = parse_module("HloModule m\n\nENTRY e {\n  ROOT p = f32[4]{0} parameter(0)\n}\n").entry.root.shape
    scalar = laid_out.with_dims(())
    assert scalar.to_hlo() == "f32[]"
    for shape in (scalar.to_hlo(), "f32[]{:S(5)}"):
        text = f"HloModule m\n\nENTRY e {{\n  ROOT p = {shape} parameter(0)\n}}\n"
        xla_canonical(text)  # XLA's parser accepts it
        assert parse_module(text).entry.root.shape.to_hlo() == shape
