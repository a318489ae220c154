"""Loads hlo_passes/grammar/hlo.lark once: one LALR parser with a start rule per entry point.

Building the LALR tables takes about 0.13 s, most of what a small `hlo-passes fmt`
costs, so the tables are cached on disk (Lark's own cache, keyed by a hash of the
grammar and the options) in a directory only the user can write: the cache is a
pickle, and a pickle from a directory others can write would run their code.
"""

from __future__ import annotations

import functools
import os
import stat
import sys
from pathlib import Path
from typing import Any

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
    "HEADER_COLON": "':'",
}


def grammar_text() -> str:
    return GRAMMAR_PATH.read_text()


@functools.cache
def lark_parser(transformer: lark.Transformer[lark.Token, Any] | None = None) -> lark.Lark:
    return lark.Lark(grammar_text(), parser="lalr", lexer="contextual", start=list(START_RULES),
                     transformer=transformer, maybe_placeholders=False, cache=_cache_file() or False)


def _cache_file() -> str | None:
    """Where the parse tables are cached: `$XDG_CACHE_HOME/hlo-passes` (default ~/.cache),
    created private; None (no cache) unless that directory is the user's own and no one
    else can write it."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    directory = os.path.join(base, "hlo-passes")
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        st = os.stat(directory)
    except OSError:
        return None
    if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or not stat.S_ISDIR(st.st_mode):
        return None
    version = f"{lark.__version__}-py{sys.version_info[0]}{sys.version_info[1]}"
    return os.path.join(directory, f"hlo-grammar-{version}.lark-cache")


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
