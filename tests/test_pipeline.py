"""Pipeline strings (parse, convert by type, print back, reject before anything runs) and
the PassManager (order, changed, remarks, timings, dumps, verify-each blame)."""

import dataclasses
import enum
from dataclasses import dataclass
from typing import Literal

import pytest

from hlo_passes import parse_module, print_module
from hlo_passes.ir import ArrayShape, Opcode, PrimitiveType
from hlo_passes.passes import registry
from hlo_passes.passes.manager import PassFailed, PassManager
from hlo_passes.passes.pass_base import ModulePass, option
from hlo_passes.passes.pipeline import (PipelineError, format_pass, option_types, parse_pass, parse_pipeline,
                                        set_option_everywhere)


class Mode(enum.Enum):
    FAST = "fast"
    CAREFUL = "careful"


class TypedOptions(ModulePass):
    """A pass with one option of every spellable type (registered only inside these tests)."""

    name = "typed-options"
    summary = "test pass"

    @dataclass(frozen=True)
    class Options:
        count: int = option(3, "an int")
        ratio: float = option(0.5, "a float")
        flag: bool = option(False, "a bool")
        label: str = option("x", "a str")
        mode: Mode = option(Mode.FAST, "an enum")
        form: Literal["packed", "variadic"] = option("packed", "a literal")
        limit: int | None = option(None, "an optional int")

    def run(self, module):
        self.remark(module.entry.root, f"count={self.options.count}", kind="note")
        return False


class NegateRoot(ModulePass):
    """Changes the module: the entry root becomes negate(root)."""

    name = "negate-root"
    summary = "test pass"

    def run(self, module):
        comp = module.entry
        old = comp.root
        from hlo_passes.ir import Instruction

        new = comp.add(Instruction(Opcode.NEGATE, old.shape, [old], name="neg"), name_hint="neg")
        comp.root = new
        self.remark(new, "negated the root", kind="applied")
        return True


class BreakShape(ModulePass):
    """Leaves a malformed module: the root's declared shape no longer follows from its operands."""

    name = "break-shape"
    summary = "test pass"

    def run(self, module):
        module.entry.root.shape = ArrayShape(PrimitiveType.F32, (5,))
        return False  # and lies about it: verify-each must still catch it


class Crash(ModulePass):
    name = "crash"
    summary = "test pass"

    def run(self, module):
        raise RuntimeError("boom")


@pytest.fixture
def test_passes(monkeypatch):
    for cls in (TypedOptions, NegateRoot, BreakShape, Crash):
        monkeypatch.setitem(registry._REGISTRY, cls.name, cls)


MODULE = """HloModule m
ENTRY e {
  p = f32[4] parameter(0)
  q = f32[4] parameter(1)
  ROOT r = f32[4] add(p, q)
}
"""


# -------------------------------------------------------------------- printing --
@pytest.mark.parametrize("text", [
    "dce",
    "dce{remove-dead-computations=false},cse{layout-sensitive=false},call-inliner{single-call-site=true}",
    "collective-fusion{combine-threshold-in-bytes=1048576}",
    "all-reduce-combiner{combine-threshold-in-bytes=64,combine-threshold-count=2},sharding-propagation",
    "collective-fusion{reduce-scatter-form=variadic,reassociate=false}",
    "sharding-propagation{propagate-to-parameters=true,propagate-to-output=false}",
    "spmd-partition{num-partitions=8},weight-update-sharding,collective-fusion{combine-threshold-in-bytes=1048576}",
])
def test_pipeline_prints_back_to_the_same_string(text):
    assert str(parse_pipeline(text)) == text


def test_default_valued_options_and_spaces_are_not_printed():
    assert str(parse_pipeline("all-reduce-combiner{combine-threshold-count=256}")) == "all-reduce-combiner"
    assert str(parse_pipeline(" dce { remove-dead-computations = false } , cse ")) == \
        "dce{remove-dead-computations=false},cse"


def test_values_are_converted_by_the_field_type(test_passes):
    p = parse_pass("typed-options{count=7,ratio=0.25,flag=true,label=hello,mode=careful,form=variadic,limit=9}")
    assert p.options == TypedOptions.Options(7, 0.25, True, "hello", Mode.CAREFUL, "variadic", 9)
    assert format_pass(p) == ("typed-options{count=7,ratio=0.25,flag=true,label=hello,mode=careful,"
                              "form=variadic,limit=9}")
    assert parse_pass("typed-options{mode=CAREFUL}").options.mode is Mode.CAREFUL  # the member name works too
    assert parse_pass("typed-options{limit=none}").options.limit is None
    # `T | None` annotations resolve to T: a real pass's optional bool becomes a bool, not the text "true"
    sp = parse_pass("sharding-propagation{propagate-to-parameters=true}")
    assert sp.options.propagate_to_parameters is True


@pytest.mark.parametrize("text, words", [
    ("typed-options{count=1.5}", "count expects a whole number, 0 or more, got '1.5'"),
    ("typed-options{ratio=half}", "ratio expects a number"),
    ("typed-options{flag=yes}", "flag expects true or false"),
    ("typed-options{mode=slow}", "mode expects one of fast|careful, got 'slow'"),
    ("typed-options{form=tuple}", "form expects one of packed|variadic"),
    ("typed-options{limit=lots}", "limit expects a whole number"),
    ("typed-options{count=1,count=2}", "'count' is given twice"),
    ("typed-options{cuont=1}", "did you mean 'count'?"),
])
def test_bad_values_name_what_was_expected(test_passes, text, words):
    with pytest.raises(PipelineError, match=words.replace("|", r"\|").replace("?", r"\?")):
        parse_pipeline(text)


@pytest.mark.parametrize("text, words", [
    ("no-such-pass", "unknown pass 'no-such-pass'; known passes: .*call-inliner, .*dce"),
    ("csee", "unknown pass 'csee' \\(did you mean 'cse'\\?\\)"),
    ("dce{bogus=1}", "unknown option 'bogus'; valid options: remove-dead-computations \\(bool\\)"),
    ("cse{layout-sensitive=maybe}", "expects true or false"),
    ("dce{remove-dead-computations}", "needs a value"),
    ("dce{remove-dead-computations=true", "unbalanced"),
    ("dce}", "unbalanced"),
    ("dce{x{y}}", "nested"),
    ("dce,,cse", "no pass name"),
    ("", "empty pipeline"),
])
def test_bad_pipelines_are_rejected(text, words):
    with pytest.raises(PipelineError, match=words):
        parse_pipeline(text)


def _non_default(kind, value):
    import typing

    if typing.get_origin(kind) is typing.Literal:
        return next(c for c in typing.get_args(kind) if c != value)
    inner = [a for a in typing.get_args(kind) if a is not type(None)]
    if value is None and inner:
        kind = inner[0]
        value = {bool: False, int: 0, float: 0.0, str: ""}.get(kind, value)
    if kind is bool:
        return not value
    if kind is int:
        return value + 1
    if kind is float:
        return value * 2 + 1
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return next(m for m in kind if m is not value)
    return "other"


def test_every_registered_pass_spells_each_option_and_reads_it_back():
    for name, cls in registry.all_passes().items():
        assert format_pass(cls()) == name
        kinds = option_types(cls.Options)
        for f in dataclasses.fields(cls.Options):
            value = _non_default(kinds[f.name], f.default)
            try:
                changed = cls(**{f.name: value})
            except ValueError:  # the pass checks this value itself: the pipeline must reject it too
                with pytest.raises(PipelineError, match=name):
                    parse_pass(f"{name}{{{f.name.replace('_', '-')}={value}}}")
                continue
            text = format_pass(changed)
            assert text.startswith(f"{name}{{{f.name.replace('_', '-')}="), text
            assert parse_pass(text).options == changed.options, text


def test_global_option_reaches_only_passes_that_have_it():
    p = parse_pipeline("all-reduce-combiner,dce,collective-fusion")
    assert set_option_everywhere(p, "combine_threshold_in_bytes", 99) == ["all-reduce-combiner", "collective-fusion"]
    assert set_option_everywhere(p, "num_partitions", 8) == []  # nobody has it: nothing happens
    assert str(p) == "all-reduce-combiner{combine-threshold-in-bytes=99},dce,collective-fusion{combine-threshold-in-bytes=99}"
    p = parse_pipeline("spmd-partition,dce")
    assert set_option_everywhere(p, "num_partitions", 4) == ["spmd-partition"]
    assert str(p) == "spmd-partition{num-partitions=4},dce"


# ---------------------------------------------------------------------- manager --
def test_manager_runs_in_order_and_collects_remarks_records_and_dumps(test_passes):
    seen = []
    manager = PassManager.from_pipeline("typed-options{count=2},negate-root,negate-root", verify_each=True,
                                        dump=lambda i, p, m, when: seen.append((i, p.name, when,
                                                                                m.entry.root.name)))
    module = parse_module(MODULE)
    assert manager.run(module) is True
    assert seen == [(0, "typed-options", "before", "r"), (0, "typed-options", "after", "r"),
                    (1, "negate-root", "before", "r"), (1, "negate-root", "after", "neg"),
                    (2, "negate-root", "before", "neg"), (2, "negate-root", "after", "neg.1")]
    assert [(r.name, r.changed, r.remarks) for r in manager.records] == [
        ("typed-options{count=2}", False, 1), ("negate-root", True, 1), ("negate-root", True, 1)]
    assert all(r.seconds >= 0 for r in manager.records)
    assert [r.format() for r in manager.remarks] == [
        "typed-options: note: e/%r: count=2", "negate-root: applied: e/%neg: negated the root",
        "negate-root: applied: e/%neg.1: negated the root"]
    assert "typed-options{count=2}" in manager.timing_report()
    assert not PassManager.from_pipeline("typed-options,dce").run(module)


def test_verify_each_blames_the_pass_that_broke_the_module(test_passes):
    module = parse_module(MODULE)
    manager = PassManager.from_pipeline("negate-root,break-shape,negate-root", verify_each=True)
    with pytest.raises(PassFailed) as info:
        manager.run(module)
    e = info.value
    assert e.pass_name == "break-shape"
    text = str(e)
    assert text.startswith("pass break-shape: the structural verifier rejects its output:")
    assert "e/%neg: shape should be f32[4] (from its operands), got f32[5]" in text
    assert "  > ROOT neg = f32[5] negate(r)" in text and "    r = f32[4] add(p, q)" in text
    assert [r.name for r in manager.records] == ["negate-root", "break-shape"]  # the third never ran
    # without verify-each the same pipeline runs to the end
    assert PassManager.from_pipeline("negate-root,break-shape,negate-root").run(parse_module(MODULE))


def test_verify_each_rejects_a_malformed_input_before_any_pass(test_passes):
    module = parse_module(MODULE.replace("ROOT r = f32[4]", "ROOT r = f32[3]"), check_semantics=False)
    manager = PassManager.from_pipeline("negate-root", verify_each=True)
    with pytest.raises(PassFailed, match="input module is malformed") as info:
        manager.run(module)
    assert info.value.pass_name == "input" and not manager.records
    assert print_module(module).count("negate") == 0


def test_a_crashing_pass_is_named(test_passes):
    manager = PassManager.from_pipeline("dce,crash,cse")
    with pytest.raises(RuntimeError, match="boom") as info:
        manager.run(parse_module(MODULE))
    assert "while running pass 2 of 3: crash" in info.value.__notes__
    assert [r.name for r in manager.records] == ["dce"]


class EditThenCrash(ModulePass):
    """Edits the module (a new root, a control edge, an erased instruction), then raises."""

    name = "edit-then-crash"
    summary = "test pass"

    def run(self, module):
        NegateRoot().run(module)
        comp = module.entry
        comp.root.add_control_predecessor(comp.parameters[0])
        raise RuntimeError("boom after editing")


def test_rollback_undoes_a_pass_that_raises_or_breaks_the_module_and_goes_on(test_passes, monkeypatch):
    monkeypatch.setitem(registry._REGISTRY, EditThenCrash.name, EditThenCrash)
    module = parse_module(MODULE)
    holder = module
    manager = PassManager.from_pipeline("negate-root,edit-then-crash,break-shape,negate-root", verify_each=True,
                                        on_failure="rollback")
    assert manager.run(module) is True
    assert module is holder  # restored in place: callers keep their object
    assert print_module(module) == print_module(parse_module(MODULE.replace(
        "  ROOT r = f32[4] add(p, q)", "  r = f32[4] add(p, q)\n  neg = f32[4] negate(r)\n"
                                       "  ROOT neg.1 = f32[4] negate(neg)")))
    assert [(r.name, r.changed) for r in manager.records] == [
        ("negate-root", True), ("edit-then-crash", False), ("break-shape", False), ("negate-root", True)]
    missed = [r.format() for r in manager.remarks if r.kind == "missed"]
    assert missed[0] == ("edit-then-crash: missed: edit-then-crash failed (raised RuntimeError: boom after "
                         "editing); its changes were undone")
    assert missed[1].startswith("break-shape: missed: break-shape failed (the structural verifier rejects")
    # the restored module is whole: its instructions belong to it, names stay unique
    for comp in module.computations:
        assert comp.module is module and all(i.parent is comp for i in comp.instructions)
    assert module.names.unique("neg") == "neg.2"
