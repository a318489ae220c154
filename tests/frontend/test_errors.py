"""Bad input: one clear `file:line:col: error:` message with the source line and
a caret, from both parser paths; XLA rejects the same texts."""

import subprocess
import sys

import pytest

from hlo_passes import HloParseError, parse_module
from tests.frontend.xla_oracle import xla_canonical

GOOD_HEAD = "HloModule m\n\nENTRY e {\n  p = f32[2] parameter(0)\n"

BAD = {
    # name: (text, line, column, words the message must contain)
    "missing_comma": (GOOD_HEAD + "  ROOT a = f32[2] add(p p)\n}\n", 5, 25, ["expected", "','", "got 'p'"]),
    "undefined_operand": (GOOD_HEAD + "  ROOT a = f32[2] add(p, q)\n}\n", 5, 26, ["'q' is not defined"]),
    "duplicate_name": (GOOD_HEAD + "  p = f32[2] negate(p)\n  ROOT a = f32[2] add(p, p)\n}\n", 5, 3,
                       ["'p' is used twice"]),
    "unknown_opcode": (GOOD_HEAD + "  ROOT a = f32[2] frobnicate(p)\n}\n", 5, 19, ["unknown opcode 'frobnicate'"]),
    "unknown_type": (GOOD_HEAD + "  ROOT a = f33[2] negate(p)\n}\n", 5, 12, ["unknown element type 'f33'"]),
    "undefined_computation": (GOOD_HEAD + "  z = f32[] constant(0)\n  ROOT r = f32[] reduce(p, z), dimensions={0}, "
                              "to_apply=nosuch\n}\n", 6, 48, ["computation 'nosuch' is not defined"]),
    "parameter_gap": (GOOD_HEAD + "  q = f32[2] parameter(2)\n  ROOT a = f32[2] add(p, q)\n}\n", 3, 7,
                      ["no parameter(1)"]),
    "unterminated": (GOOD_HEAD + "  ROOT a = f32[2] negate(p)\n", 6, 1, ["expected", "got end of input"]),
    "no_computation": ("HloModule m\n", 2, 1, ["expected", "end of input"]),
    "duplicate_attribute": (GOOD_HEAD + "  ROOT a = f32[2] negate(p), metadata={}, metadata={}\n}\n", 5, 43,
                            ["'metadata' given twice"]),
    "two_roots": (GOOD_HEAD + "  ROOT a = f32[2] negate(p)\n  ROOT b = f32[2] negate(p)\n}\n", 6, 8,
                  ["more than one ROOT"]),
}


@pytest.mark.parametrize("name", sorted(BAD))
@pytest.mark.parametrize("engine", ["auto", "lark"])
def test_error_position_and_message(name, engine):
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


# XLA's parser aborts the process (a failed CHECK) on a parameter-number gap
# instead of reporting it; ours reports it.
XLA_ABORTS = {"parameter_gap"}


@pytest.mark.parametrize("name", sorted(set(BAD) - XLA_ABORTS))
def test_xla_rejects_them_too(name):
    with pytest.raises(Exception):
        xla_canonical(BAD[name][0])


def run_cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "hlo_passes", *args], input=stdin, capture_output=True,
                          text=True)


def test_cli_reports_error_without_traceback(tmp_path):
    bad = tmp_path / "bad.hlo"
    bad.write_text(BAD["missing_comma"][0])
    result = run_cli("fmt", str(bad))
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith(f"{bad}:5:25: error: expected")
    assert "Traceback" not in result.stderr


def test_cli_in_place_leaves_bad_file_untouched(tmp_path):
    bad = tmp_path / "bad.hlo"
    text = BAD["undefined_operand"][0]
    bad.write_text(text)
    assert run_cli("fmt", "--in-place", str(bad)).returncode == 2
    assert bad.read_text() == text
    assert list(tmp_path.iterdir()) == [bad]


def test_cli_fmt_writes_output_only_on_success(tmp_path):
    good = tmp_path / "good.hlo"
    good.write_text(GOOD_HEAD + "  ROOT a = f32[2] negate(p)\n}\n")
    out = tmp_path / "out.hlo"
    assert run_cli("fmt", str(good), "-o", str(out)).returncode == 0
    assert xla_canonical(out.read_text()) == xla_canonical(good.read_text())
    missing = run_cli("fmt", str(tmp_path / "nope.hlo"))
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_cli_fmt_reads_stdin():
    result = run_cli("fmt", "-", stdin=GOOD_HEAD + "  ROOT a = f32[2] negate(p)\n}\n")
    assert result.returncode == 0
    assert "ROOT a = f32[2] negate(p)" in result.stdout
