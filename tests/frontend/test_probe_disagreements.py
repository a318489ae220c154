"""Rules a differential probe against XLA's parser found us breaking, checked in their general
form: which characters are whitespace, which string escapes read, and error messages that name
what was expected without the parser library's internals."""

import pytest

from hlo_passes import HloParseError, parse_module, print_module
from tests.frontend.rejection_cases import CASES as REJECTED
from tests.frontend.xla_oracle import xla_canonical

# Every character Python's str.isspace() takes: XLA's lexer skips only the first four.
SPACES = [chr(c) for c in range(0x110000) if chr(c).isspace()]
XLA_SPACES = {" ", "\t", "\n", "\r"}

BETWEEN = "HloModule m\n\nENTRY e {\n  a = f32[4] parameter(0)\n  ROOT n = f32[4] add(a,@ a)\n}\n"
IN_STRING = ('HloModule m\n\nENTRY e {\n  a = f32[4] parameter(0)\n'
             '  ROOT n = f32[4] negate(a), metadata={op_name="x@y"}\n}\n')


def _xla_accepts(text: str) -> bool:
    try:
        xla_canonical(text)
    except Exception:  # noqa: BLE001 - XLA's refusal
        return False
    return True


@pytest.mark.parametrize("ch", SPACES, ids=lambda c: f"U+{ord(c):04X}")
@pytest.mark.parametrize("engine", ["auto", "lark"])
def test_whitespace_is_what_xla_skips(ch, engine):
    text = BETWEEN.replace("@", ch)
    assert _xla_accepts(text) == (ch in XLA_SPACES)
    if ch in XLA_SPACES:
        parse_module(text, engine=engine)
    else:
        with pytest.raises(HloParseError) as info:
            parse_module(text, "bad.hlo", engine=engine)
        assert (info.value.line, info.value.column) == (5, 25)
        assert "unexpected character" in info.value.message


@pytest.mark.parametrize("ch", SPACES + ["\x00", "\x07", "\x7f"], ids=lambda c: f"U+{ord(c):04X}")
def test_any_character_but_a_quote_reads_inside_a_string(ch):
    text = IN_STRING.replace("@", ch)
    expected = xla_canonical(text)
    ours = print_module(parse_module(text))
    assert xla_canonical(ours) == expected
    assert print_module(parse_module(text, engine="lark")) == ours


ESCAPES = [r"\n", r"\t", r"\r", r"\\", r"\"", r"\'", r"\?", r"\a", r"\b", r"\f", r"\v", r"\x41", r"\x41b",
           r"\x41z", r"\x4", r"\x", r"\x0041", r"\xfff", r"\X41", r"\101", r"\1011", r"\400", r"\777", r"\0",
           r"\8", r"\u0041", r"\u41", r"\U00000041", r"\U0000004", r"\u00e9", r"\ud800", r"\U00110000", r"\q",
           r"\e", "\\ ", "\\\t"]


@pytest.mark.parametrize("escape", ESCAPES)
def test_string_escapes_read_as_xla_reads_them(escape):
    text = IN_STRING.replace("@", escape)
    if _xla_accepts(text):
        ours = print_module(parse_module(text))
        assert xla_canonical(ours) == xla_canonical(text)
    else:
        with pytest.raises(HloParseError) as info:
            parse_module(text, "bad.hlo")
        assert info.value.line == 5


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_messages_show_no_parser_internals(name):
    text = REJECTED[name][0]
    with pytest.raises(HloParseError) as info:
        parse_module(text, "bad.hlo")
    message = info.value.message
    for leak in ("Token(", "Tree(", "one of ,", "expected ,", "$END", "__ANON", "Traceback"):
        assert leak not in message, message
