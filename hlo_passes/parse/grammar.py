"""Loads hlo_passes/grammar/hlo.lark once: one LALR parser with a start rule per entry point.

Building the LALR tables takes about 0.13 s, most of what a small `hlo-passes fmt`
costs, so the tables are cached on disk (Lark's own cache, keyed by a hash of the
grammar and the options) in a directory only the user can write: the cache is a
pickle, and a pickle from a directory others can write would run their code.

Two ways to run the grammar, both safe to use from several threads at once:

* `compiled()`, the grammar's Lark object, shared by every caller: it builds parse trees
  and keeps no state between parses (each parse makes its own lexer and parser state).
* `InlineParser(transformer)`, one per parse: the same tables with the rules calling
  `transformer`'s methods as they are reduced, so that no tree is built for a big module
  (the module builder) and nothing ties two parses together.  It is the one place that
  reaches into Lark's internals (see its docstring).
"""

from __future__ import annotations

import functools
import os
import stat
import sys
from pathlib import Path
from typing import Any, cast

import lark
from lark.lexer import LexerThread
from lark.parsers.lalr_parser import _Parser as _LalrParser

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
    "HEADER_COLON": "':'", "ELEMENT_REF": "a tuple element reference (name#index)",
}


def grammar_text() -> str:
    return GRAMMAR_PATH.read_text()


# Cached once per process: the Lark object is immutable once built and reentrant (Lark keeps
# each parse's lexer and parser state in objects of that parse).
@functools.cache
def compiled() -> lark.Lark:
    """The grammar's LALR parser (building parse trees), shared by every caller."""
    return lark.Lark(grammar_text(), parser="lalr", lexer="contextual", start=list(START_RULES),
                     maybe_placeholders=False, cache=_cache_file() or False)


class InlineParser:
    """The grammar's tables driven with `transformer`'s methods as rule callbacks (Lark's
    inline transformation: no parse tree is kept), for one parse.

    Lark binds a transformer when it builds a parser, and building one (or loading it from
    the disk cache) costs ~8 ms; making the callbacks for a new transformer costs ~0.3 ms.
    So this reuses `compiled()`'s tables, lexer and rule wrappers and builds only the
    callbacks, through Lark internals (`Lark._parse_tree_builder`,
    `ParsingFrontend._make_lexer_thread`, `lalr_parser._Parser`: present through lark 1.x,
    run with 1.3.1; the whole front end goes through here, so any test notices a change).
    What it shares of Lark's is only read (each parse makes its own lexer and parser state;
    the lexer's regexes, built on first use, may be built twice, identically), so parsers
    made from it can run on several threads at once.
    """

    __slots__ = ("_frontend", "_parser")

    def __init__(self, transformer: lark.Transformer[lark.Token, Any]):
        shared = compiled()
        frontend = shared.parser
        tree_builder: Any = shared._parse_tree_builder  # lark leaves it unannotated
        self._frontend = frontend
        self._parser = _LalrParser(frontend.parser.parser.parse_table, tree_builder.create_callback(transformer))

    def parse(self, text: str, start: str) -> Any:
        """What `transformer` makes of `text` read from rule `start` (Lark's UnexpectedInput on
        a syntax error; exceptions the callbacks raise pass through unwrapped)."""
        if start not in START_RULES:
            raise ValueError(f"unknown start rule {start!r}")
        lexer = cast(LexerThread, self._frontend._make_lexer_thread(text))  # a str makes a LexerThread
        return self._parser.parse(lexer, start)


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
        pattern = compiled().get_terminal(name).pattern
    except KeyError:
        return name
    if pattern.type == "str":
        return repr(pattern.value)
    return name.lower().replace("_", " ")
