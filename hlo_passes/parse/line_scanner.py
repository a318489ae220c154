"""Fast path of the parser: reads HLO as XLA prints it, one instruction per line.

Lark's LALR parser over the whole grammar reads about 1 MB/s; XLA's C++ parser
about 20 MB/s.  Dumps of real models are tens of MB, so the common shape of a
line — `[ROOT] name = shape opcode(operands), key=value, ...` — is split here
with a few regular expressions, and everything structured still goes through
the grammar: shapes (cached by their text: a model repeats a few hundred shapes
tens of thousands of times), module headers, computation headers and tables are
parsed with the grammar's own start rules, and attribute values are kept as
text exactly like the Lark path keeps them, to be read by the same typed
readers on demand.

Both paths call the same builder callbacks (which report semantic errors at the
token that causes them) with the same pieces (parse/pieces.py), and the test suite
checks that they build identical modules for every file of the corpus.  The scanner
tells the builder which line it is reading, so that instructions get the same
source spans on both paths.  An instruction line the scanner does not
recognise is read with the grammar's `instruction` rule alone, in the same
builder state: a syntax error there is reported at once (so a bad last line of a
20 MB dump does not send the whole file down the slow path), and a line the
grammar reads continues the scan.  Anything else it does not recognise (a
multi-line instruction, an unusual header) raises `Fallback`, and the caller
parses the whole text with the grammar.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Any, Iterator, cast

from lark.exceptions import UnexpectedInput

from hlo_passes.ir.attributes import Attr
from hlo_passes.ir.shape import Shape
from hlo_passes.parse import grammar
from hlo_passes.parse.errors import SemanticError
from hlo_passes.parse.pieces import (ComputationHeader, DebugTable, ModuleHeader, Operand, ParsedInstruction,
                                     Signature, TextRange, TypedOperand)
from hlo_passes.parse.shapes import parse_shape

if TYPE_CHECKING:
    from hlo_passes.ir.computation import Computation
    from hlo_passes.ir.module import Module
    from hlo_passes.parse.module_parser import ModuleBuilder


class Token:
    """The few fields of a lark Token the builder reads, at a fraction of its cost."""

    __slots__ = ("type", "value", "start_pos")

    def __init__(self, type_: str, value: str, start_pos: int):
        self.type = type_
        self.value = value
        self.start_pos = start_pos

    @property
    def end_pos(self) -> int:
        return self.start_pos + len(self.value)


class Fallback(Exception):
    """The fast path cannot read this text; use the full grammar."""


_NAME = r"%?[A-Za-z_][\w.\-]*"
_ARRAY_SHAPE = r"[a-z][a-z0-9]*\[[^\]]*\](?:\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\})?"
_HEAD = re.compile(rf"\s*(ROOT\s+)?({_NAME})\s*=\s*")
_HEAD_ARRAY = re.compile(rf"\s*(ROOT\s+)?({_NAME})\s*=\s*({_ARRAY_SHAPE})\s*([a-z][a-z0-9\-]*)\(")
_ARRAY_SHAPE_RE = re.compile(_ARRAY_SHAPE)
_OPCODE = re.compile(r"\s*([a-z][a-z0-9\-]*)\(")
_OPERAND_NAME = re.compile(rf"\s*({_NAME}(?:#[0-9]{{1,9}})?)\s*$")
_TYPED_OPERAND = re.compile(rf"\s*(?:({_ARRAY_SHAPE})\s+)?({_NAME}(?:#[0-9]{{1,9}})?)\s*(?:,|$)")
_ATTR_START = re.compile(r",\s*([A-Za-z_][\w\-.]*)=")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_STRING_OR_COMMENT = re.compile(r'"(?:[^"\\]|\\.)*"|/\*.*?\*/')
_PARENS = re.compile(r"[()]")
_MODULE_HEAD = re.compile(rf"\s*HloModule\s+({_NAME})")
_COMP_HEAD = re.compile(rf"\s*(ENTRY\s+)?({_NAME}):?\s*(?:\((.*)\)\s*->\s*(.*?))?\s*\{{\s*$")
_PARAM_DECL = re.compile(rf"\s*({_NAME})\s*:\s*({_ARRAY_SHAPE}|\()")
_STRING_ROW = re.compile(r'\s*([0-9]{1,18})\s+("(?:[^"\\]|\\.)*")\s*$')
_RECORD_ROW = re.compile(r"\s*([0-9]{1,18})\s+\{((?:\s*[A-Za-z_][A-Za-z0-9_]*=-?[0-9]{1,18}(?![0-9]))*)\s*\}\s*$")
_TABLE_TITLES = frozenset({"FileNames", "FunctionNames", "FileLocations", "StackFrames"})
# Characters Python's `\s` and str.strip() take for whitespace that XLA's lexer does not (it skips
# only space, tab, CR and LF): a text holding one is read by the grammar, which refuses them
# outside strings and comments.
_ODD_SPACE_ASCII = "\x0b\x0c\x1c\x1d\x1e\x1f"
_ODD_SPACE = re.compile("[\x0b\x0c\x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]")


def has_odd_space(text: str) -> bool:
    """Whether `text` holds a character Python counts as whitespace and XLA's lexer does not."""
    if text.isascii():
        return any(c in text for c in _ODD_SPACE_ASCII)
    return _ODD_SPACE.search(text) is not None


def strip_comments(text: str) -> str:
    """`text` without its /* ... */ comments (strings are left alone).

    Both parser paths keep attribute values without comments, so that long
    tuples' `/*index=5*/` markers never end up inside a value's text."""
    if "/*" not in text:
        return text
    return _STRING_OR_COMMENT.sub(lambda m: m.group() if m.group().startswith('"') else "", text)


def blank_comments(text: str) -> str:
    """`text` with each /* ... */ comment replaced by spaces: positions stay those of the source."""
    if "/*" not in text:
        return text
    return _STRING_OR_COMMENT.sub(lambda m: m.group() if m.group().startswith('"') else " " * len(m.group()),
                                  text)


def _json_string(text: str) -> str:
    from hlo_passes.parse.strings import unquote

    try:
        return unquote(text)
    except ValueError:
        raise Fallback from None  # the grammar reports it at its place


def _balanced_end(text: str, open_index: int) -> int:
    """Index just past the ')' that closes the '(' at `open_index`."""
    depth = 0
    for m in _PARENS.finditer(text, open_index):
        depth += 1 if m.group() == "(" else -1
        if depth == 0:
            return m.end()
    raise Fallback


def _brackets_balance(segment: str) -> bool:
    return (segment.count("{") == segment.count("}") and segment.count("[") == segment.count("]")
            and segment.count("(") == segment.count(")"))


def _is_balanced(segment: str) -> bool:
    """Whether `segment` closes every bracket and string it opens (a value ends here)."""
    if '"' not in segment:
        return _brackets_balance(segment)
    if (segment.count('"') - segment.count('\\"')) % 2:
        return False
    if _brackets_balance(segment):
        return True
    # Brackets inside strings do not count: look again without the strings.
    return _brackets_balance(_STRING.sub('""', segment))


def split_attributes(tail: str, offset: int, original: str | None = None) -> list[tuple[Token, Attr]]:
    """`, k=v, k2=v2` → [(key token, Attr(raw value))], splitting only at top-level commas."""
    if not tail or tail.isspace():
        return []
    starts = list(_ATTR_START.finditer(tail))
    if not starts or tail[: starts[0].start()].strip() or tail.rstrip().endswith(","):
        raise Fallback  # (a trailing comma: the instruction goes on on the next line)
    result = []
    i = 0
    while i < len(starts):
        m = starts[i]
        j = i + 1
        while True:
            end = starts[j].start() if j < len(starts) else len(tail)
            value = tail[m.end():end]
            if _is_balanced(value):
                break
            if j >= len(starts):
                raise Fallback
            j += 1
        raw = value.strip()
        if "  " in raw and original is not None:  # a blanked comment: keep the text as the grammar path does
            raw = strip_comments(original[m.end():m.end() + len(value)]).strip()
        if not raw or "//" in _STRING.sub("", raw) or "/*" in _STRING.sub("", raw):
            raise Fallback
        result.append((Token("NAME", m.group(1), offset + m.start(1)), Attr(raw=raw)))
        i = j
    return result


class LineScanner:
    """Builds a module from XLA-printed text through the parser's builder callbacks (one
    scanner and one builder per parse)."""

    def __init__(self, builder: ModuleBuilder, text: str):
        self.b = builder
        self.text = text
        self.shapes: dict[str, Shape] = {}  # this text's shapes, before the shared cache

    @functools.cached_property
    def parser(self) -> grammar.InlineParser:
        """The grammar, calling this parse's builder: made when a line needs it (~0.3 ms)."""
        return grammar.InlineParser(self.b)

    def shape(self, text: str) -> Shape:
        shape = self.shapes.get(text)
        if shape is None:
            try:
                shape = parse_shape(text)
            except (SemanticError, UnexpectedInput):  # positions are the line's: let the grammar say
                raise Fallback from None
            self.shapes[text] = shape
        return shape

    def lines(self) -> Iterator[tuple[int, int, str]]:
        """(number, offset, line) for each line, with its newline; no list of all lines is made."""
        text = self.text
        n = len(text)
        pos = 0
        number = 0
        while pos < n:
            end = text.find("\n", pos) + 1 or n
            number += 1
            yield number, pos, text[pos:end]
            pos = end

    def scan(self) -> Module:
        if has_odd_space(self.text):
            raise Fallback  # the scanner's regular expressions would take it for whitespace
        b = self.b
        header = None
        tables: list[DebugTable] = []
        computations: list[Computation] = []
        current: ComputationHeader | None = None  # the computation being read
        records: list[ParsedInstruction] = []  # its instructions so far
        table: list[str] | None = None  # the lines (title, rows) of the table being read
        for number, start, line in self.lines():
            stripped = line.strip()
            if table is not None:
                if stripped and stripped not in _TABLE_TITLES:
                    table.append(line)
                    continue
                tables.append(self.table(table))
                table = None
            if not stripped:
                continue
            if stripped.startswith("//"):
                continue
            b.set_line(number, start)  # where the builder's spans of this line's tokens count from
            if current is not None:
                if stripped.startswith("}"):
                    if not records:  # no instruction: the grammar says what it expected
                        raise Fallback
                    close = line.index("}")
                    attrs = split_attributes(line[close + 1:].rstrip("\r\n"), start + close + 1)
                    computations.append(b.finish_computation(current, records, attrs))
                    current, records = None, []
                else:
                    try:
                        record = self.instruction(line, start)
                    except Fallback:
                        record = self.instruction_by_grammar(line, number, start)
                    records.append(record)
                continue
            if header is None and not computations and not tables and stripped.startswith("HloModule"):
                header = self.module_header(line, start)
                continue
            if stripped in _TABLE_TITLES:
                table = [line]
                continue
            if stripped.endswith("{"):
                current = self.computation_header(line, start)
                continue
            raise Fallback
        if table is not None:
            tables.append(self.table(table))
        if current is not None or not computations:
            raise Fallback
        return b.finish_module(header, tables)

    def instruction_by_grammar(self, line: str, number: int, offset: int) -> ParsedInstruction:
        """Read one instruction line (line `number`, at `offset`) with the grammar (same builder
        state); errors are reported at their place in the file, except one at the end of the
        line (the instruction may go on below), which sends the whole text to the grammar."""
        from hlo_passes.parse.module_parser import lark_error_message  # module_parser imports this module

        b = self.b
        full = b.text
        b.text = line
        b.line_offset = number - 1  # the grammar counts this line as line 1
        try:
            return cast(ParsedInstruction, self.parser.parse(line, "instruction"))  # built inline
        except SemanticError as e:
            pos = e.token.start_pos if e.token is not None and hasattr(e.token, "start_pos") else e.pos
            if pos is None and e.span is None:  # no place: the caller finds one in the whole text
                raise
            raise SemanticError(e.message, pos=offset + (pos or 0)) from None
        except UnexpectedInput as e:
            pos, message = lark_error_message(line, e)
            if pos >= len(line.rstrip()) or '"' in _STRING.sub("", line) or line[pos:pos + 1] == "}":
                # (a string left open goes on on the next line; a '}' may close the computation)
                raise Fallback from None
            raise SemanticError(message, pos=offset + pos) from None
        finally:
            b.text = full
            b.line_offset = 0

    def module_header(self, line: str, offset: int) -> ModuleHeader:
        original, line = line, blank_comments(line)
        m = _MODULE_HEAD.match(line)
        if m is None:
            raise Fallback
        name_tok = Token("NAME", m.group(1), offset + m.start(1))
        rest = m.end()
        if line[rest:rest + 1] == ":":  # `HloModule name:` of older dumps
            rest += 1
        elif re.match(r"\s+:", line[rest:]):
            raise Fallback  # a ':' apart from the name: the builder says why it is wrong
        return self.b.module_header([name_tok, split_attributes(line[rest:].rstrip("\r\n"), offset + rest,
                                                                 original[rest:].rstrip("\r\n"))])

    def computation_header(self, line: str, offset: int) -> ComputationHeader:
        m = _COMP_HEAD.match(line)
        if m is None:
            raise Fallback
        entry = Token("ENTRY", "ENTRY", offset + m.start(1)) if m.group(1) else None
        name_tok = Token("NAME", m.group(2), offset + m.start(2))
        signature = None
        if m.group(4) is not None:
            params = []
            body = m.group(3)
            pos = 0
            while pos < len(body):
                pm = _PARAM_DECL.match(body, pos)
                if pm is None:
                    raise Fallback
                if pm.group(2) == "(":
                    end = _balanced_end(body, pm.start(2))
                else:
                    end = pm.end()
                params.append((Token("NAME", pm.group(1), offset + m.start(3) + pm.start(1)),
                               self.shape(body[pm.start(2):end])))
                rest = body[end:].lstrip()
                if rest and not rest.startswith(","):
                    raise Fallback
                pos = len(body) - len(rest) + (1 if rest else 0)
            signature = Signature(params, self.shape(m.group(4).strip()))
        children = [c for c in (entry, name_tok, signature) if c is not None]
        return self.b.computation_header(children)

    def table(self, block: list[str]) -> DebugTable:
        from hlo_passes.parse.module_parser import record_problem  # module_parser imports this module

        title = block[0].strip()
        rows: list[tuple[int, Any]] = []
        for line in block[1:]:
            if title in ("FileNames", "FunctionNames"):
                m = _STRING_ROW.match(line)
                if m is None:
                    raise Fallback
                rows.append((int(m.group(1)), _json_string(m.group(2))))
            else:
                m = _RECORD_ROW.match(line)
                if m is None:
                    raise Fallback
                pairs = re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=(-?[0-9]+)", m.group(2))
                fields = {k: int(v) for k, v in pairs}
                table_key = "file_locations" if title == "FileLocations" else "stack_frames"
                if len(fields) != len(pairs) or record_problem(table_key, fields) is not None:
                    raise Fallback  # the grammar reports it at its place
                rows.append((int(m.group(1)), fields))
        key = {"FileNames": "file_names", "FunctionNames": "function_names",
               "FileLocations": "file_locations", "StackFrames": "stack_frames"}[title]
        return DebugTable(key, dict(rows))

    def instruction(self, line: str, offset: int) -> ParsedInstruction:
        original, line = line, blank_comments(line)
        m = _HEAD_ARRAY.match(line)
        if m is not None:  # the common case: an array-shaped instruction
            shape = self.shapes.get(m.group(3)) or self.shape(m.group(3))
            opcode = m.group(4)
            opcode_pos = m.start(4)
            open_paren = m.end() - 1
        else:
            m = _HEAD.match(line)
            if m is None:
                raise Fallback
            pos = m.end()
            if line.startswith("(", pos):
                shape_end = _balanced_end(line, pos)
            else:
                sm = _ARRAY_SHAPE_RE.match(line, pos)
                if sm is None:
                    raise Fallback
                shape_end = sm.end()
            shape = self.shape(line[pos:shape_end])
            om = _OPCODE.match(line, shape_end)
            if om is None:
                raise Fallback
            opcode = om.group(1)
            opcode_pos = om.start(1)
            open_paren = om.end() - 1
        close = line.find(")", open_paren)
        if close < 0:
            raise Fallback
        if "(" in line[open_paren + 1:close]:
            close = _balanced_end(line, open_paren) - 1
        body = line[open_paren + 1:close]
        body_offset = offset + open_paren + 1
        if opcode == "constant" or opcode == "parameter":
            lstrip = len(body) - len(body.lstrip())
            literal = body.strip()
            if not literal:
                raise Fallback
            s = body_offset + lstrip
            operands: list[Operand] = [TextRange(s, s + len(literal))]
        elif not body.strip():
            operands = []
        else:
            # Operands by name, or the instruction itself where it is already defined (XLA
            # prints operands before their users); a name not defined yet keeps its position,
            # for the builder's error message.
            if self.b.keyword_names:
                raise Fallback  # names that are keywords resolve through the builder's checks
            defined = self.b.by_name
            if "[" in body or "(" in body:
                operands = []
                pos_b = 0
                while pos_b < len(body):
                    tm = _TYPED_OPERAND.match(body, pos_b)
                    if tm is None:
                        raise Fallback
                    ref = Token("NAME", tm.group(2), body_offset + tm.start(2))
                    if tm.group(1):
                        self.b.operand_shapes = True
                        operands.append(TypedOperand(self.shape(tm.group(1)), ref))
                    else:
                        operands.append(defined.get(ref.value[1:] if ref.value[0] == "%" else ref.value) or ref)
                    pos_b = tm.end()
                operands = operands[:]  # sized exactly: it becomes the operand list
            else:
                parts = body.split(",")
                operands = [None] * len(parts)  # sized exactly: it becomes the operand list
                at = 0
                for i, part in enumerate(parts):
                    nm = _OPERAND_NAME.match(part)
                    if nm is None:
                        raise Fallback
                    ref_text = nm.group(1)
                    found = defined.get(ref_text[1:] if ref_text[0] == "%" else ref_text)
                    operands[i] = found if found is not None else Token("NAME", ref_text,
                                                                        body_offset + at + nm.start(1))
                    at += len(part) + 1
        attrs = split_attributes(line[close + 1:].rstrip("\r\n"), offset + close + 1,
                                 original[close + 1:].rstrip("\r\n"))
        opcode_tok = Token("NAME", opcode, offset + opcode_pos)
        name_tok = Token("NAME", m.group(2), offset + m.start(2))
        span = self.b.span_on_line(m.start(2) + 1)  # the builder's span_of(name_tok), without the token
        return self.b.add_instruction(name_tok, m.group(1) is not None, shape, opcode_tok, operands, attrs, span)
