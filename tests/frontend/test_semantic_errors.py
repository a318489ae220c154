"""Semantic errors the parser reports (operand counts and shapes, via the verifier's rules):
one `file:line:col` message at the instruction's name, from both parser paths, for texts
that XLA rejects too (its parser for operand counts and element counts, its compiler for
the rest)."""

import pytest

from hlo_passes import HloParseError, parse_module
from tests.verifier.xla_oracle import xla_rejects

HEAD = "HloModule m\n\nENTRY e {\n  p = f32[2,3] parameter(0)\n  q = f32[3,4] parameter(1)\n"

BAD = {
    # name: (text, line, column, words the message must contain)
    "operand_count": (HEAD + "  ROOT r = f32[2,3] add(p)\n}\n", 6, 8, ["'r' expects 2 operands, but has 1"]),
    "too_many_operands": (HEAD + "  n = f32[2,3] negate(p, p)\n  ROOT r = f32[2,3] add(n, n)\n}\n", 6, 3,
                          ["'n' expects 1 operand, but has 2"]),
    "dot_shape": (HEAD + "  ROOT %r = f32[2,5] dot(p, q), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n",
                  6, 8, ["'r' shape should be f32[2,4]", "got f32[2,5]"]),
    "reshape_elements": (HEAD + "  ROOT r = f32[7] reshape(p)\n}\n", 6, 8, ["same number of elements"]),
    "elementwise_dims": (HEAD + "  ROOT r = f32[3,4] multiply(p, q)\n}\n", 6, 8, ["same dimensions"]),
    "in_called_computation": ("HloModule m\n\nf {\n  x = f32[4] parameter(0)\n  ROOT y = pred[4] negate(x)\n}\n\n"
                              "ENTRY e {\n  p = f32[4] parameter(0)\n  ROOT c = pred[4] call(p), to_apply=f\n}\n",
                              5, 8, ["'y' shape should be f32[4]"]),
    "element_type_as_name": (HEAD + "  s1 = f32[2,3] negate(p)\n  ROOT r = f32[2,3] add(s1, p)\n}\n", 6, 3,
                             ["illegal instruction name 's1'", "element type"]),
    "element_type_as_percent_name": (HEAD + "  %f32 = f32[2,3] negate(p)\n  ROOT r = f32[2,3] add(%f32, p)\n}\n",
                                     6, 3, ["illegal instruction name 'f32'"]),
}


@pytest.mark.parametrize("name", sorted(BAD))
@pytest.mark.parametrize("engine", ["auto", "lark"])
def test_semantic_error_position_and_message(name, engine):
    text, line, column, words = BAD[name]
    with pytest.raises(HloParseError) as info:
        parse_module(text, "bad.hlo", engine=engine)
    err = info.value
    assert (err.filename, err.line, err.column) == ("bad.hlo", line, column), err.format()
    for word in words:
        assert word in err.message, err.format()
    rendered = err.format().splitlines()
    assert rendered[0].startswith(f"bad.hlo:{line}:{column}: error: ")
    assert rendered[2] == " " * (column - 1) + "^"


@pytest.mark.parametrize("name", sorted(BAD))
def test_xla_rejects_them_too(name):
    assert xla_rejects(BAD[name][0]) is not None


def test_check_semantics_false_reads_them():
    module = parse_module(BAD["dot_shape"][0], check_semantics=False)
    assert module.entry.root.name == "r"


def test_same_name_in_two_computations_points_at_the_right_one():
    text = ("HloModule m\n\nf {\n  x = f32[4] parameter(0)\n  ROOT y = f32[4] negate(x)\n}\n\n"
            "ENTRY e {\n  p = f32[4] parameter(0)\n  c = f32[4] call(p), to_apply=f\n"
            "  ROOT y = f32[5] negate(c)\n}\n")
    with pytest.raises(HloParseError) as info:
        parse_module(text, "two.hlo")
    assert (info.value.line, info.value.column) == (11, 8), info.value.format()


def test_cli_reports_semantic_error(tmp_path):
    import subprocess
    import sys

    bad = tmp_path / "bad.hlo"
    bad.write_text(BAD["dot_shape"][0])
    result = subprocess.run([sys.executable, "-m", "hlo_passes", "fmt", str(bad)], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.startswith(f"{bad}:6:8: error: 'r' shape should be f32[2,4]")
    assert "Traceback" not in result.stderr
