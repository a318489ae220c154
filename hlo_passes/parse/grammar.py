"""Loads hlo_passes/grammar/hlo.lark once: one LALR parser with a start rule per entry point."""

from __future__ import annotations

import functools
from pathlib import Path

import lark

# The grammar is package data (hlo_passes/grammar/, shipped in the wheel; the top-level
# grammar/ of the checkout is a link to it), so it loads relative to the package.
GRAMMAR_PATH = Path(__file__).resolve().parents[1] / "grammar" / "hlo.lark"

START_RULES = (
    "module", "module_header", "table", "computation_header", "instruction", "shape",
    "attr_sharding", "attr_replica_groups", "attr_pairs", "attr_int_list", "attr_slice",
    "attr_padding", "attr_window", "attr_dim_labels", "attr_metadata", "attr_frontend_attributes",
    "attr_shape_list", "attr_computation_layout",
)

# Human names for terminals in "expected ..." messages.
TERMINAL_NAMES = {
    "NAME": "a name", "INT": "an integer", "NUMBER": "a number", "STRING": "a string",
    "ATOM": "an attribute value", "LAYOUT": "a layout", "COMMA": "','", "LBRACE": "'{'",
    "RBRACE": "'}'", "LSQB": "'['", "RSQB": "']'", "LPAR": "'('", "RPAR": "')'", "EQUAL": "'='",
    "COLON": "':'", "ROOT": "'ROOT'", "ENTRY": "'ENTRY'", "__ANON_0": "'->'", "IOTA_LE": "'<='",
    "IOTA_T": "'T'", "ELLIPSIS": "'...'", "QMARK": "'?'", "LESSTHAN": "'<'", "MORETHAN": "'>'",
}


def grammar_text() -> str:
    return GRAMMAR_PATH.read_text()


@functools.cache
def lark_parser(transformer: lark.Transformer | None = None) -> lark.Lark:
    return lark.Lark(grammar_text(), parser="lalr", lexer="contextual", start=list(START_RULES),
                     transformer=transformer, maybe_placeholders=False, cache=False)


def terminal_description(name: str) -> str:
    """How an "expected ..." message names a terminal: keywords and punctuation quoted."""
    if name in TERMINAL_NAMES:
        return TERMINAL_NAMES[name]
    try:
        pattern = lark_parser().get_terminal(name).pattern
    except KeyError:
        return name
    if pattern.type == "str":
        return repr(pattern.value)
    return name.lower().replace("_", " ")
