"""Hostile input ends with one clear error and exit 2: bounded work for tiny inputs that ask for
a lot, bounded error text, no traceback, nothing written.  The limits are parse/limits.py's."""

import subprocess
import sys

import pytest

from hlo_passes import HloParseError, parse_module, print_module
from hlo_passes.cli.main import main
from hlo_passes.parse import grammar
from hlo_passes.parse.limits import MAX_DEVICES, MAX_NESTING, MAX_TUPLE_DEPTH

GOOD = "HloModule m\n\nENTRY e {\n  p = f32[4] parameter(0)\n  ROOT n = f32[4] negate(p)\n}\n"


def entry(body: str) -> str:
    return "HloModule m\n\nENTRY e {\n" + body + "\n}\n"


def test_parameter_number_far_past_the_count_allocates_nothing():
    """Parameters are collected by number and checked for 0..n-1 at the end, so a number in
    the billions costs nothing (the old parser made one slot per number)."""
    with pytest.raises(HloParseError, match=r"has no parameter\(0\)"):
        parse_module(entry("  ROOT p = f32[] parameter(9000000000000000000)"))


@pytest.mark.parametrize("value,what", [
    ("[1000000000,1]<=[1000000000]", "replica_groups"),
    ("[4,2147483648]<=[8589934592]", "replica_groups"),
])
def test_replica_groups_over_too_many_devices(value, what):
    text = entry(f"  p = f32[4] parameter(0)\n  ROOT r = f32[4] all-reduce(p), replica_groups={value}, to_apply=add")
    text = text.replace("ENTRY e", "add {\n  x = f32[] parameter(0)\n  y = f32[] parameter(1)\n"
                                   "  ROOT s = f32[] add(x, y)\n}\n\nENTRY e")
    with pytest.raises(HloParseError, match="MAX_DEVICES") as info:
        parse_module(text)
    assert info.value.line == 11 and what in info.value.message


def test_spmd_partition_of_an_iota_sharding_over_2_31_devices(tmp_path, capsys):
    path = tmp_path / "big.hlo"
    path.write_text(entry("  p = f32[8] parameter(0), sharding={devices=[2147483648]<=[2147483648]}\n"
                          "  ROOT n = f32[8] negate(p)"))
    assert main(["run", str(path), "--passes=spmd-partition", "--num-partitions=8"]) == 2
    err = capsys.readouterr().err
    assert f"more than {MAX_DEVICES:,} devices" in err and "Traceback" not in err


def test_num_partitions_that_does_not_fit_the_shardings(tmp_path, capsys):
    path = tmp_path / "m.hlo"
    path.write_text(entry("  p = f32[8] parameter(0), sharding={devices=[8]<=[8]}\n  ROOT n = f32[8] negate(p)"))
    out = tmp_path / "out.hlo"
    assert main(["run", str(path), "--passes=spmd-partition", "--num-partitions=3", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--num-partitions 3: e/p is sharded over 8 devices" in err and not out.exists()


def test_pipeline_values_are_checked_before_anything_runs(tmp_path, capsys):
    path = tmp_path / "m.hlo"
    path.write_text(GOOD)
    assert main(["run", str(path), "--passes=collective-fusion{reduce-scatter-form=sideways}"]) == 2
    assert "expects one of packed|variadic" in capsys.readouterr().err
    assert main(["run", str(path), "--passes=spmd-partition{num-partitions=-4}"]) == 2
    assert "expects a whole number" in capsys.readouterr().err


def _tuple_shape(depth: int) -> str:
    return "(" * depth + "f32[]" + ")" * depth


def test_deep_tuple_shapes_stop_at_the_limit():
    deepest = entry(f"  ROOT p = {_tuple_shape(MAX_TUPLE_DEPTH)} parameter(0)")
    module = parse_module(deepest)
    assert print_module(parse_module(print_module(module))) == print_module(module)
    for depth in (MAX_TUPLE_DEPTH + 1, 500, 5000):
        with pytest.raises(HloParseError, match="MAX_TUPLE_DEPTH"):
            parse_module(entry(f"  ROOT p = {_tuple_shape(depth)} parameter(0)"))


def test_deep_tuple_constants_stop_at_the_limit():
    depth = 500
    with pytest.raises(HloParseError, match="MAX_TUPLE_DEPTH"):
        parse_module(entry(f"  ROOT c = {_tuple_shape(depth)} constant({'(' * depth}1{')' * depth})"))


@pytest.mark.parametrize("engine", ["auto", "lark"])
def test_operands_nested_a_thousand_deep_are_read(engine):
    """XLA reads operands nested ~1,000 deep; so do we (built without recursion)."""
    text = entry(f"  p = f32[] parameter(0)\n  ROOT r = f32[] {'negate(' * (MAX_NESTING - 1)}p{')' * (MAX_NESTING - 1)}")
    module = parse_module(text, engine=engine)
    assert len(module.entry.instructions) == MAX_NESTING
    assert print_module(parse_module(print_module(module))) == print_module(module)
    deeper = entry(f"  p = f32[] parameter(0)\n  ROOT r = f32[] {'negate(' * 3000}p{')' * 3000}")
    with pytest.raises(HloParseError, match="MAX_NESTING"):
        parse_module(deeper, engine=engine)


def test_deep_brackets_in_an_attribute_value():
    text = entry("  ROOT p = f32[] parameter(0), sharding=" + "{" * 3000 + "}" * 3000)
    with pytest.raises(HloParseError):
        parse_module(text)


def test_a_bad_last_line_does_not_send_a_big_file_down_the_grammar(monkeypatch):
    """XLA-printed text is read line by line; an error on its last line is found there, without
    reading the whole file again with the grammar (34 s instead of 5 s on a 20 MB dump)."""
    lines = [f"  a{i} = f32[8]{{0}} negate(a{i - 1}), metadata={{op_name=\"x/{i}\"}}" for i in range(1, 20000)]
    text = "HloModule m\n\nENTRY e {\n  a0 = f32[8]{0} parameter(0)\n" + "\n".join(lines)
    text += "\n  ROOT r = f32[8]{0} add(a19999, a_missing)\n}\n"
    real = grammar.InlineParser.parse

    def no_whole_module(parser, text, start):
        assert start != "module", "the whole module went to the grammar"
        return real(parser, text, start)

    monkeypatch.setattr(grammar.InlineParser, "parse", no_whole_module)
    with pytest.raises(HloParseError) as info:
        parse_module(text, "big.hlo")
    assert (info.value.line, info.value.column) == (20004, 34)
    assert "'a_missing' is not defined" in info.value.message


def test_syntax_error_on_the_last_line_is_found_by_that_line_alone(monkeypatch):
    lines = [f"  a{i} = f32[8]{{0}} negate(a{i - 1})" for i in range(1, 2000)]
    text = "HloModule m\n\nENTRY e {\n  a0 = f32[8]{0} parameter(0)\n" + "\n".join(lines)
    text += "\n  ROOT r = f32[8]{0} add(a1999 a1998)\n}\n"
    real = grammar.InlineParser.parse
    wholes = []

    def counting(parser, text, start):
        wholes.append(start == "module")
        return real(parser, text, start)

    monkeypatch.setattr(grammar.InlineParser, "parse", counting)
    with pytest.raises(HloParseError) as info:
        parse_module(text)
    assert info.value.line == 2004 and "expected" in info.value.message
    assert not any(wholes)


def test_error_text_is_bounded_for_huge_lines():
    huge = "x" * 10_000_000
    for text in (entry(f'  ROOT p = f32[] parameter(0) "{huge}"'),
                 entry(f"  ROOT p = f32[] parameter(0), {huge}=1"),
                 entry(f"  ROOT p = f32[] {huge}(0)")):
        with pytest.raises(HloParseError) as info:
            parse_module(text)
        assert len(info.value.format()) < 3000
        caret_line = info.value.format().splitlines()[2]
        assert caret_line.strip() == "^"


def test_a_lone_carriage_return_ends_a_line():
    text = "HloModule m\r\rENTRY e {\r  p = f32[4] parameter(0)\r  ROOT n = f32[4] negate(q)\r}\r"
    with pytest.raises(HloParseError) as info:
        parse_module(text, "mac.hlo")
    assert (info.value.line, info.value.column) == (5, 26)
    assert parse_module(GOOD.replace("\n", "\r\n")).entry.root.name == "n"


@pytest.mark.parametrize("digits", ["\u0664", "\u096a", "\uff14"])
def test_only_ascii_digits_are_numbers(digits):
    with pytest.raises(HloParseError):
        parse_module(entry(f"  ROOT p = f32[{digits}] parameter(0)"))


def test_an_unexpected_failure_is_one_line_not_a_traceback(tmp_path, monkeypatch, capsys):
    """A bug (an exception nobody expected) still ends with one clear line and exit 2."""
    import hlo_passes.cli.fmt as fmt

    def broken(module):
        raise RuntimeError("printer exploded")

    monkeypatch.setattr(fmt, "print_module", broken)
    path = tmp_path / "m.hlo"
    path.write_text(GOOD)
    out = tmp_path / "out.hlo"
    assert main(["fmt", str(path), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "internal error" in err and "printer exploded" in err and "Traceback" not in err
    assert "cli/fmt.py" in err and not out.exists()


@pytest.mark.parametrize("text", [
    entry("  ROOT p = f32[] parameter(-1)"),
    "HloModule m\n\nENTRY e {\n}\n",
    entry("  ROOT p = f32[" + "7" * 4300 + "] parameter(0)"),
    entry(f"  ROOT p = {_tuple_shape(600)} parameter(0)"),
])
def test_cli_reports_hostile_modules_without_traceback(tmp_path, text):
    path = tmp_path / "bad.hlo"
    path.write_text(text)
    done = subprocess.run([sys.executable, "-m", "hlo_passes", "fmt", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith(f"{path}:") and "Traceback" not in done.stderr
    assert done.stdout == ""
