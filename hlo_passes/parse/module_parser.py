"""Text → IR: runs the Lark grammar and builds Module / Computation / Instruction.

The builder is a Lark Transformer applied inline by the LALR parser, so no parse
tree is kept for the (large) module.  As in XLA's parser, names resolve when they
are read: an operand, a control predecessor or a called computation must be
defined above its use (so the text can hold no cycles and no recursion), and
each instruction is complete when its line is read, which lets the builder infer
the shape of an instruction written without one (`ROOT v = abs(a)`) from its
operands, by the verifier's shape rules.

What XLA's parser checks, this builder checks, each at the offending token:
attribute keys per opcode (`opcode_attributes`), attribute values, literals
against their shapes (`literal_check`), operand counts, declared operand shapes
against their definitions, conditional selectors, custom-call layout
constraints, async start/update/done chains (and the `op-start` sugar, turned
into an async-start calling a one-instruction computation as XLA does).
Attribute values are kept as their exact source text and read into typed values
on demand (see attribute_reader).

Each parse has its own ModuleBuilder (and, on the grammar path, its own InlineParser): the
module keeps nothing of one parse for the next, and parses may run on several threads at once.
What is shared between parses is immutable or a thread-safe cache of pure functions of text
(the grammar's tables, opcode plans, checked attribute values, shapes).  Every instruction
and computation keeps the SourceSpan it was read from.
"""

from __future__ import annotations

import functools
import gc
import re
from dataclasses import dataclass
from sys import intern
from typing import Any, Callable, Final, Sequence, cast

import lark
from lark import Token

from hlo_passes.ir.attributes import Attr
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import CALLED_COMPUTATION_KEYS, Instruction, intern_attributes
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import OPCODES_BY_NAME, Opcode
from hlo_passes.ir.shape import ArrayShape, Layout, Shape, TupleShape
from hlo_passes.ir.source import COLUMN_LIMIT, SourceSpan, SpanFields, file_base, line_base, unpack_span
from hlo_passes.ir.types import PRIMITIVE_TYPES_BY_NAME, PrimitiveType
from hlo_passes.parse import attribute_reader  # noqa: F401 - registers the readers the IR reads attributes with
from hlo_passes.parse import grammar
from hlo_passes.parse import opcode_attributes as schema
from hlo_passes.parse.errors import HloParseError, SemanticError, TokenLike, line_at, position_of
from hlo_passes.parse.limits import INT64_MAX, MAX_NESTING, MAX_TUPLE_DEPTH, parse_int64, quote
from hlo_passes.parse.line_scanner import Fallback, LineScanner, strip_comments
from hlo_passes.parse.line_scanner import Token as ScannedToken
from hlo_passes.parse.literal_check import LiteralProblem, check_literal
from hlo_passes.parse.pieces import (AsyncChain, ComputationHeader, DebugTable, ModuleHeader, NestedOperand,
                                     Operand, ParsedInstruction, Signature, TableRecord, TextRange, TypedOperand)
from hlo_passes.parse.shapes import ShapeBuilder, depth, parse_shape


def _range(item: Token | TextRange) -> TextRange:
    if isinstance(item, Token):
        return TextRange(cast(int, item.start_pos), cast(int, item.end_pos))  # the parser's tokens have positions
    return item


# Words XLA's lexer never reads as a name (hlo_lexer.cc): its keywords and `nan`, and the element
# types (tuple and buffer excepted, which are no type words).  Written bare they cannot name a
# module, a computation or an instruction, nor refer to one; with a '%' before them they can
# (an instruction still cannot be named after an element type), and a module's or
# computation's name may also be kept from the lexer by a ':' right after it (`HloModule s2:`).
KEYWORDS: Final = frozenset({
    "true", "false", "inf", "nan", "HloModule", "ENTRY", "ROOT", "FileLocations", "FileNames", "FunctionNames",
    "StackFrames", "maximal", "replicated", "manual", "last_tile_dim_replicate", "shard_as", "shard_like",
    "unknown", "unreduced"})
RESERVED_WORDS: Final = KEYWORDS | frozenset(PRIMITIVE_TYPES_BY_NAME)


def _reserved_word(word: str) -> str:
    return "an element type" if word in PRIMITIVE_TYPES_BY_NAME else "a keyword"


def _bare(name: str) -> str:
    return name[1:] if name.startswith("%") else name


def _positioned(ref: Any) -> Any:
    """`ref` when it can carry an error position (a token), else None."""
    return ref if hasattr(ref, "start_pos") else None


_ASYNC_SUFFIXES = (("-start", Opcode.ASYNC_START), ("-update", Opcode.ASYNC_UPDATE), ("-done", Opcode.ASYNC_DONE))
_REFERENCE_LIST_KEYS = frozenset({"branch_computations", "called_computations"})
_PARAMETER_NUMBER = re.compile(r"-?[0-9]+")  # compiled once: a dump has thousands of parameters


class ModuleBuilder(ShapeBuilder):
    """Builds one module from one text: the grammar's inline callbacks, also called by the line
    scanner.  Made for each parse (`parse_module`), never reused: it holds that parse's state."""

    def __init__(self, text: str, filename: str | None, check_semantics: bool) -> None:
        super().__init__()
        self.text = text
        self.filename = filename
        self.check_semantics = check_semantics
        # Where lark tokens' lines count from (a line the scanner hands to the grammar alone is
        # line 1 of what the grammar reads), and the line the scanner is reading: its number and
        # the offset it starts at (the scanner's tokens carry offsets only).
        self.line_offset = 0
        self.line = 1
        self.line_start = 0
        # Packed spans (ir/source.py): what every span of this file, and of the scanner's
        # line (`set_line`), starts from.
        self.file_base = file_base(filename)
        self.line_base = line_base(self.file_base, 1)
        # Memos of the shared caches below, for this parse (a dict look-up costs less than a call).
        self.plans: dict[str, _Plan] = {}
        self.checked: set[tuple[Callable[[str], None], str]] = set()
        self.anonymous_names: dict[str, int] = {}
        self.percent_names = False
        self.operand_shapes = False
        # (key, text) -> Attr: one slot for every repeat of an attribute (metadata repeats a lot).
        self.attr_slots: dict[tuple[str, str], Attr] = {}
        # Module scope: computations defined so far (a callee precedes its callers), in order.
        self.computations: dict[str, Computation] = {}
        self.order: list[Computation] = []
        self.entry: Computation | None = None
        self.first_computation: ComputationHeader | None = None
        self.async_chain: dict[Instruction, AsyncChain] = {}
        self.async_callers: dict[Computation, Instruction] = {}
        self.synthesized: list[Computation] = []
        self._begin_computation("")

    def _begin_computation(self, name: str) -> None:
        self.computation_name = name
        self.by_name: dict[str, Instruction] = {}
        self.current: list[Instruction] = []
        self.params: dict[int, Instruction] = {}
        self.element_refs: dict[tuple[Instruction, int], Instruction] = {}
        self.pending_computations: list[Computation] = []
        self.nested_built: dict[int, Instruction] = {}
        self.keyword_names = False  # an instruction here is named by a keyword (written `%true`)

    # ---------------------------------------------------------------- spans --
    def set_line(self, number: int, start: int) -> None:
        """The scanner reads line `number`, which starts at offset `start`."""
        self.line, self.line_start = number, start
        self.line_base = line_base(self.file_base, number)

    def span_on_line(self, column: int) -> SpanFields:
        """The span of `column` on the scanner's line, packed."""
        base = self.line_base
        return base | column if base is not None and column < COLUMN_LIMIT else (self.filename, self.line, column)

    def span_of(self, tok: TokenLike) -> SpanFields:
        """Where `tok` is in the file, packed: the scanner's tokens are on the line being
        scanned, lark's know their line and column."""
        if type(tok) is ScannedToken:
            return self.span_on_line(tok.start_pos - self.line_start + 1)
        lark_tok = cast(Token, tok)
        line, column = self.line_offset + cast(int, lark_tok.line), cast(int, lark_tok.column)
        base = line_base(self.file_base, line)
        return base | column if base is not None and column < COLUMN_LIMIT else (self.filename, line, column)

    # ------------------------------------------------------------- literals --
    def literal_scalar(self, c: list[Any]) -> TextRange:
        return _range(c[0])

    def _literal_range(self, c: list[Any]) -> TextRange:
        return TextRange(_range(c[0]).start, _range(c[-1]).end)

    def literal_braces(self, c: list[Any]) -> TextRange:
        return self._literal_range(c)

    def literal_paren(self, c: list[Any]) -> TextRange:
        return self._literal_range(c)

    # -------------------------------------------------------------- operands --
    def operand_ref(self, c: list[Any]) -> Operand:
        return c[0]  # the name token

    def typed_operand_ref(self, c: list[Any]) -> TypedOperand:
        self.operand_shapes = True
        return TypedOperand(c[0], c[1])

    def nested_instruction(self, c: list[Any]) -> NestedOperand:
        return NestedOperand(c[0], c[1], c[2])

    def untyped_nested_instruction(self, c: list[Any]) -> NestedOperand:
        return NestedOperand(None, c[0], c[1])

    def operand(self, c: list[Any]) -> Operand:  # a literal reached through `operand`: its TextRange
        return c[0]

    def operand_list(self, c: list[Any]) -> list[Operand]:
        return c

    # ------------------------------------------------------------ attributes --
    def group(self, c: list[Any]) -> TextRange:
        return TextRange(_range(c[0]).start, _range(c[-1]).end)

    inner_group = group

    def attr_value(self, c: list[Any]) -> str:
        return strip_comments(self.text[_range(c[0]).start:_range(c[-1]).end])

    def attribute(self, c: list[Any]) -> Any:
        key = c[0]
        if self.text[key.end_pos:key.end_pos + 1] != "=":  # XLA's lexer reads `name=` as one token
            raise SemanticError(f"expects attribute name: write '=' right after {quote(key.value)}, with no "
                                "space before it", key)
        return key, Attr(raw=c[1])

    def instruction_attrs(self, c: list[Any]) -> Any:
        return c

    computation_attrs = instruction_attrs
    module_attrs = instruction_attrs

    # ----------------------------------------------------------- instruction --
    def instruction(self, c: list[Any]) -> ParsedInstruction:
        is_root = isinstance(c[0], Token) and c[0].type == "ROOT"
        if is_root:
            c = c[1:]
        if len(c) == 5:
            name_tok, shape, opcode_tok, operands, attrs = c
        else:
            name_tok, opcode_tok, operands, attrs = c
            shape = None
        return self.add_instruction(name_tok, is_root, shape, opcode_tok, operands, attrs, self.span_of(name_tok))

    def add_instruction(self, name_tok: TokenLike, is_root: bool, shape: Shape | None, opcode_tok: TokenLike,
                        operands: list[Operand], attrs: Sequence[tuple[TokenLike, Attr]],
                        span: SpanFields) -> ParsedInstruction:
        """Build one top-level instruction of the computation being read (both parser paths);
        `span` is where its name is."""
        name = name_tok.value
        if name.startswith("%"):
            self.percent_names = True
            name = name[1:]
        instr = self._build(name, name_tok, shape, opcode_tok, operands, attrs, span)
        return ParsedInstruction(instr, is_root)

    def _build(self, name: str, name_tok: TokenLike, shape: Shape | None, opcode_tok: TokenLike,
               operands: list[Operand], attrs: Sequence[tuple[TokenLike, Attr]], span: SpanFields,
               nested_depth: int = 0) -> Instruction:
        if name in RESERVED_WORDS:
            if name in PRIMITIVE_TYPES_BY_NAME:  # XLA's lexer reads these as element types
                raise SemanticError(f"illegal instruction name '{name}': it is an element type "
                                    f"(rename it, e.g. to '{name}_')", name_tok)
            if not name_tok.value.startswith("%"):
                raise SemanticError(f"expects an instruction name: '{name}' is a keyword in HLO text "
                                    f"(write '%{name}', or rename it)", name_tok)
            self.keyword_names = True  # references to it must carry the '%' too (`_resolve`)
        plan = self.plans.get(opcode_tok.value) or self._plan(opcode_tok)
        opcode = plan.opcode
        # The shape is inferred below when None.
        instr = Instruction(opcode, shape, name=name, span=span)  # type: ignore[arg-type]
        ops = self._operands(instr, opcode, operands, nested_depth)
        if plan.literal:
            if opcode is Opcode.PARAMETER:
                self._parameter(instr, ops, opcode_tok)
            else:
                self._constant(instr, ops, opcode_tok)
        else:
            instr._init_operands(tuple(ops))
            if self.check_semantics:
                n = len(ops)
                if n < plan.low or (plan.high is not None and n > plan.high) or (
                        plan.parity is not None and n % 2 != plan.parity):
                    self._operand_count(instr, name_tok if nested_depth == 0 else opcode_tok)
        keys = plan.keys if not plan.dynamic_keys else self._attribute_keys(instr, plan)
        if attrs or keys.required:
            self._attributes(instr, attrs, keys, opcode_tok, nested_depth > 0)
        if plan.references and attrs:
            self._references(instr, attrs)
        if plan.checks:
            self._opcode_checks(instr, opcode_tok, plan.wrapped)
        if shape is None:
            self._infer(instr, opcode_tok)
        if plan.wrapped is not None:
            instr = self._async_sugar(instr, opcode_tok, plan.wrapped)
        if plan.shape_checks or instr.has_attr("parameter_replication") or type(instr.shape) is TupleShape:
            self._shape_checks(instr, opcode_tok)
        self._define(instr, name_tok)
        return instr

    # ----------------------------------------------------------------- operands
    def _operands(self, instr: Instruction, opcode: Opcode, operands: list[Operand],
                  nested_depth: int) -> list[Any]:
        """Operands as instructions (a constant's or parameter's stay TextRanges of its literal)."""
        if opcode is Opcode.CONSTANT or opcode is Opcode.PARAMETER:
            literal = []
            for op in operands:
                if type(op) is TextRange:
                    literal.append(op)
                elif hasattr(op, "start_pos"):  # `true`, `nan`: a name token
                    literal.append(TextRange(op.start_pos, op.end_pos))
                else:
                    raise SemanticError(f"{opcode.value} expects a literal", _positioned(op))
            return literal
        out: list[Any] = [None] * len(operands)  # the operands (the caller makes them a tuple)
        for i, op in enumerate(operands):
            kind = type(op)
            if kind is Instruction:
                out[i] = op
            elif kind is TypedOperand:
                declared, ref = op
                target = ref if type(ref) is Instruction else self._resolve(ref)
                if self.check_semantics and not _compatible(declared, target.shape):
                    raise SemanticError(f"the declared operand shape {declared.to_hlo()} is not compatible with the "
                                        f"shape of the operand instruction {target.shape.to_hlo()} ('{target.name}')",
                                        _positioned(ref))
                out[i] = target
            elif kind is NestedOperand:
                built = self.nested_built.pop(id(op), None)
                out[i] = built if built is not None else self._build_nested(op)
            elif kind is TextRange:
                raise SemanticError(f"{opcode.value} expects operand names, got a literal", pos=op.start)
            else:  # a name: a lark Token, or the line scanner's Token or str
                out[i] = self._resolve(op)
        return out

    def _build_nested(self, top: NestedOperand) -> Instruction:
        """Build the nested operand `top` and every operand nested in it, innermost first and left
        to right (as XLA creates them), without recursion: nesting may be 1,000 deep."""
        stack = [(top, 0, 1)]
        while stack:
            op, child, level = stack.pop()
            if level > MAX_NESTING:
                raise SemanticError(f"operands are nested more than {MAX_NESTING} deep (MAX_NESTING)", op.opcode)
            operands = op.operands
            while child < len(operands) and type(operands[child]) is not NestedOperand:
                child += 1
            if child < len(operands):
                stack.append((op, child + 1, level))
                stack.append((operands[child], 0, level + 1))
                continue
            tok = op.opcode
            instr = self._build(self._anonymous_name(tok.value), tok, op.shape, tok, op.operands, [],
                                self.span_of(tok), level)
            if op is top:
                return instr
            self.nested_built[id(op)] = instr
        raise AssertionError("unreachable")

    def _resolve(self, ref: Any) -> Instruction:
        """The instruction an operand name refers to (`%t#1`: element 1 of tuple `t`); it must
        be defined above, in the same computation."""
        raw = ref if type(ref) is str else ref.value
        bare = _bare(raw)
        target = self.by_name.get(bare)
        if target is not None:
            if self.keyword_names and bare in KEYWORDS and bare == raw:
                raise SemanticError(f"expects an operand name: '{bare}' is a keyword in HLO text (write "
                                    f"'%{bare}')", _positioned(ref))
            return target
        name, _, index = bare.partition("#")
        target = self.by_name.get(name)
        if target is None:
            raise SemanticError(f"'{name}' is not defined in computation '{self.computation_name}' "
                                "(operands must be defined above their use)", _positioned(ref))
        if index:
            return self._tuple_element(target, _small_int(index), ref)
        return target

    def _tuple_element(self, tuple_instr: Instruction, index: int, tok: Any) -> Instruction:
        """`%call#1` — XLA's shorthand for element 1 of a tuple — as the get-tuple-element
        XLA's parser makes of it (named `call_1`, added just before its first user)."""
        key = (tuple_instr, index)
        if key not in self.element_refs:
            shape = tuple_instr.shape
            if not isinstance(shape, TupleShape) or not 0 <= index < len(shape.elements):
                raise SemanticError(f"'{tuple_instr.name}' has no tuple element {index}", _positioned(tok))
            gte = Instruction(Opcode.GET_TUPLE_ELEMENT, shape.elements[index], [tuple_instr],
                              name=f"{tuple_instr.name}_{index}",
                              span=self.span_of(tok) if _positioned(tok) is not None else None)
            gte.set_attr("index", index)
            self.current.append(gte)
            self.element_refs[key] = gte
        return self.element_refs[key]

    def _anonymous_name(self, opcode: str) -> str:
        """XLA's name for a nested (anonymous) instruction: `negate.anon`, `negate.anon.1`, ..."""
        base = f"{opcode}.anon"
        while True:
            n = self.anonymous_names.get(base, 0)
            self.anonymous_names[base] = n + 1
            name = base if n == 0 else f"{base}.{n}"
            if name not in self.by_name:
                return name

    def _plan(self, tok: TokenLike) -> _Plan:
        """The plan of an opcode spelling: a known opcode, or `op-start`/`-update`/`-done` sugar."""
        try:
            plan = self.plans[tok.value] = _plan_of(tok.value)
        except _UnknownOpcode as e:
            raise SemanticError(str(e), tok) from None
        return plan

    def _operand_count(self, instr: Instruction, tok: TokenLike) -> None:
        from hlo_passes.verifier.shape_rules import operand_count_problem

        problem = operand_count_problem(instr)
        if problem is not None:
            raise SemanticError(f"'{instr.name}' {problem}", tok)

    # ------------------------------------------------------ constant, parameter
    def _literal_text(self, ops: list[Any], opcode_tok: TokenLike) -> tuple[str, int]:
        if not ops or any(type(o) is Instruction for o in ops):
            what = "a literal, as in constant(0)" if opcode_tok.value == "constant" else "its number"
            raise SemanticError(f"{opcode_tok.value} needs {what}", opcode_tok)
        start, end = ops[0].start, ops[-1].end
        return self.text[start:end], start

    def _parameter(self, instr: Instruction, ops: list[Any], opcode_tok: TokenLike) -> None:
        text, start = self._literal_text(ops, opcode_tok)
        if len(ops) != 1 or not _PARAMETER_NUMBER.fullmatch(text):
            raise SemanticError("parameter needs its number, as in parameter(0)", pos=start)
        try:
            n = parse_int64(text)
        except ValueError as e:
            raise SemanticError(str(e), pos=start) from None
        if n < 0:
            raise SemanticError("parameter number must be >= 0", pos=start)
        if n in self.params:
            raise SemanticError(f"parameter number {n} is used twice in computation '{self.computation_name}'",
                                pos=start)
        instr.parameter_number = n
        self.params[n] = instr

    def _constant(self, instr: Instruction, ops: list[Any], opcode_tok: TokenLike) -> None:
        text, start = self._literal_text(ops, opcode_tok)
        instr.literal = text
        if instr.shape is None:
            raise SemanticError("cannot infer shape for opcode: constant (write the result shape)", opcode_tok)
        _check_extent(instr.shape, opcode_tok)
        try:
            check_literal(text, instr.shape)
        except LiteralProblem as e:
            raise SemanticError(str(e), pos=start + e.offset) from None

    # -------------------------------------------------------------- attributes
    def _attribute_keys(self, instr: Instruction, plan: "_Plan") -> "_Keys":
        """The keys of a conditional (by its selector) or a broadcast (by its operand's rank)."""
        if instr.opcode is Opcode.CONDITIONAL and instr.operands:
            selector = instr.operands[0].shape
            is_pred = type(selector) is ArrayShape and selector.element_type is PrimitiveType.PRED
            return _CONDITIONAL_PRED_KEYS if is_pred else _CONDITIONAL_INDEX_KEYS
        if instr.opcode is Opcode.BROADCAST and instr.operands:
            x = instr.operands[0].shape
            if not (type(x) is ArrayShape and not x.dims):  # a scalar needs no dimensions
                return _BROADCAST_ARRAY_KEYS
        return plan.keys

    def _attributes(self, instr: Instruction, attrs: Sequence[tuple[TokenLike, Attr]], keys: "_Keys",
                    opcode_tok: TokenLike, nested: bool) -> None:
        attrs = _mesh_device_ids_joined(attrs)
        slots = self.attr_slots
        checked = self.checked
        attributes: dict[str, Attr] = {}  # the instruction's (it is new, without any), kept if not empty
        checks = keys.checks
        for key_tok, attr in attrs:
            key = intern(key_tok.value)  # one string per key, not one per use
            if key in attributes:
                raise SemanticError(f"attribute '{key}' given twice", key_tok)
            check = checks.get(key)
            if check is None:
                raise SemanticError(f"unexpected attribute '{key}' for {opcode_tok.value}; it takes: "
                                    f"{', '.join(sorted(checks))}", key_tok)
            raw = cast(str, attr.raw)  # parsed: has text
            if (check, raw) not in checked:
                try:
                    if key in _NAMED_FIELD_KEYS and "=" in raw:
                        _check_names_before_equals(raw, key == "frontend_attributes")
                    _check_value(check, raw)
                except ValueError as e:
                    raise SemanticError(f"error parsing attribute {key}: {e}", key_tok) from None
                checked.add((check, raw))
            attributes[key] = slots.setdefault((key, raw), attr)
        for key in keys.required:
            if key not in attributes:
                where = " (a nested instruction takes no attributes)" if nested else ""
                raise SemanticError(f"attribute {key} is expected but not seen{where}", opcode_tok)
        if attributes:  # instructions given the same slots share one dict (ir/instruction.py)
            instr.attributes = intern_attributes(attributes.items())  # type: ignore[assignment]

    def _references(self, instr: Instruction, attrs: Sequence[tuple[TokenLike, Attr]]) -> None:
        """Called computations and control predecessors, defined above their use."""
        called = None
        for key_tok, attr in attrs:
            key = key_tok.value
            if key in CALLED_COMPUTATION_KEYS:
                raw = cast(str, attr.raw).strip()  # parsed: has text
                written = [x.strip() for x in raw[1:-1].split(",") if x.strip()] if raw.startswith("{") else [raw]
                comps = []
                for w in written:
                    if w in RESERVED_WORDS:
                        raise SemanticError(f"expects a computation name: '{w}' is {_reserved_word(w)} in HLO "
                                            f"text (write '%{w}')", key_tok)
                    n = _bare(w)
                    comp = self.computations.get(n)
                    if comp is None:
                        raise SemanticError(f"computation '{n}' is not defined (a computation must be defined "
                                            "above its callers)", key_tok)
                    comps.append(comp)
                if called is None:
                    called = {}
                called[key] = tuple(comps) if raw.startswith("{") or key in _REFERENCE_LIST_KEYS else comps[0]
            elif key == "control-predecessors":
                for w in (x.strip() for x in cast(str, attr.raw).strip()[1:-1].split(",")):
                    if w in KEYWORDS:
                        raise SemanticError(f"expects an instruction name: '{w}' is a keyword in HLO text "
                                            f"(write '%{w}')", key_tok)
                    n = _bare(w)
                    pred = self.by_name.get(n)
                    if pred is None:
                        raise SemanticError(f"control predecessor '{n}' is not defined in "
                                            f"'{self.computation_name}' (it must be defined above)", key_tok)
                    instr.add_control_predecessor(pred)
        if called is not None:
            instr.called = called

    # ------------------------------------------------------ per-opcode checks --
    def _opcode_checks(self, instr: Instruction, tok: TokenLike, wrapped: Opcode | None) -> None:
        """What XLA's parser checks per opcode before it builds the instruction."""
        op, ops = instr.opcode, instr.operands
        attr = instr.attributes
        if op is Opcode.CONDITIONAL and ops:
            sel = ops[0].shape
            if type(sel) is not ArrayShape or sel.dims:
                raise SemanticError("the first operand of a conditional must be a scalar", tok)
            if sel.element_type not in (PrimitiveType.PRED, PrimitiveType.S32):
                raise SemanticError("the first operand of a conditional must be a scalar of PRED or S32", tok)
            branches = instr.called.get("branch_computations", ())
            count = len(branches) if "branch_computations" in instr.called else 2
            if count == 0 or len(ops) != count + 1:
                raise SemanticError(f"a conditional with {count} branches takes {count + 1} operands, "
                                    f"has {len(ops)}", tok)
        elif op in (Opcode.SORT, Opcode.CONCATENATE, Opcode.GET_DIMENSION_SIZE, Opcode.SET_DIMENSION_SIZE,
                    Opcode.ALL_GATHER, Opcode.ALL_GATHER_START, Opcode.REDUCE_SCATTER, Opcode.SCAN) \
                or (op is Opcode.ALL_TO_ALL and "dimensions" in attr):
            if len(instr.attr("dimensions", ())) != 1:
                raise SemanticError(f"{op.value} needs dimensions={{d}} naming exactly one dimension", tok)
            if op is Opcode.SCAN and ops:
                comp = cast("Computation | None", instr.called.get("to_apply"))
                if comp is not None and len(comp.parameters) != len(ops):
                    raise SemanticError(f"expects {len(ops)} operands to match the number of parameters of "
                                        f"to_apply, but to_apply has {len(comp.parameters)} parameters", tok)
                if len(ops) < instr.attr("num_carries", 0):
                    raise SemanticError("a scan has fewer operands than num_carries", tok)
        elif op in (Opcode.DYNAMIC_SLICE, Opcode.DYNAMIC_UPDATE_SLICE) and ops:
            lead = 1 if op is Opcode.DYNAMIC_SLICE else 2
            if len(ops) < lead:
                raise SemanticError(f"expected at least {lead} operands", tok)
            x = ops[0].shape
            rank = len(x.dims) if type(x) is ArrayShape else 0
            vector = (len(ops) == lead + 1 and type(ops[lead].shape) is ArrayShape
                      and len(cast(ArrayShape, ops[lead].shape).dims) == 1)
            if not vector and len(ops) != lead + rank:
                raise SemanticError(f"wrong number of operands: {op.value} of a rank {rank} operand takes "
                                    f"{lead + rank} (or {lead + 1} with an index vector)", tok)
        elif op in (Opcode.COLLECTIVE_PERMUTE, Opcode.COLLECTIVE_PERMUTE_START) and "slice_sizes" in attr:
            if len(ops) != 4:
                raise SemanticError("a collective-permute with slice_sizes must have exactly four operands "
                                    "for dynamic-slice and in-place update", tok)
        elif op is Opcode.RNG_BIT_GENERATOR:
            if len(ops) != 1:
                raise SemanticError(f"rng-bit-generator expects 1 operand (the state), but has {len(ops)} "
                                    "operands", tok)
        elif op is Opcode.DYNAMIC_RESHAPE:
            rank = len(instr.shape.dims) if type(instr.shape) is ArrayShape else 0
            if type(instr.shape) is ArrayShape and len(ops) != rank + 1:
                raise SemanticError(f"dynamic-reshape expects one dim size operand per result dimension; got "
                                    f"{max(len(ops) - 1, 0)} for {rank} result dimensions", tok)
        elif op in (Opcode.RECV_DONE, Opcode.SEND_DONE) and ops:
            source = ops[0]
            if op is Opcode.RECV_DONE and len(ops) == 1 and not (
                    type(source.shape) is TupleShape and source.shape.elements):
                raise SemanticError(f"recv-done's operand must be a recv (a tuple of data, context and token); "
                                    f"'{source.name}' is {source.shape.to_hlo() if source.shape else 'not'}",
                                    tok)
            if not self.check_semantics:
                return
            if source.opcode in (Opcode.RECV, Opcode.SEND) and instr.attr("channel_id") != source.attr("channel_id"):
                raise SemanticError(f"channel_id must match the channel_id of {source.name}", tok)
        elif op in (Opcode.ASYNC_UPDATE, Opcode.ASYNC_DONE):
            self._async_link(instr, tok, wrapped)
        elif op is Opcode.ASYNC_START and wrapped is None:
            comp = cast("Computation | None", instr.called.get("calls"))
            if comp is not None:
                if comp in self.async_callers:
                    raise SemanticError(f"computation {comp.name} is called by more than one async op "
                                        f"({self.async_callers[comp].name} and {instr.name})", tok)
                self.async_callers[comp] = instr
                thread = instr.attr("async_execution_thread", "main")
                self.async_chain[instr] = AsyncChain(cast(Instruction, comp.root).opcode, comp, thread)

    def _async_link(self, instr: Instruction, tok: TokenLike, wrapped: Opcode | None) -> None:
        """async-update/-done: one operand, an async-start or -update; the same wrapped op,
        computation and thread as the chain it continues."""
        ops = instr.operands
        link = self.async_chain.get(ops[0]) if len(ops) == 1 else None
        if link is None or ops[0].opcode is Opcode.ASYNC_DONE:
            raise SemanticError("async-update and async-done expect a single async op as their operand", tok)
        chain_opcode, comp, thread = link.wrapped, link.computation, link.thread
        if wrapped is not None and wrapped is not chain_opcode:
            raise SemanticError(f"expect async wrapped opcode to be {chain_opcode.value}, but got {wrapped.value}", tok)
        given = cast("Computation | None", instr.called.get("calls"))
        if given is not None and given is not comp:
            raise SemanticError(f"expect async_wrapped_computation to be {comp.name}, but got {given.name}", tok)
        if "async_execution_thread" in instr.attributes and instr.attr("async_execution_thread") != thread:
            raise SemanticError(f"expect async_execution_thread to be {thread!r}, but got "
                                f"{instr.attr('async_execution_thread')!r}", tok)
        if instr.opcode is Opcode.ASYNC_UPDATE:
            self.async_chain[instr] = link

    def _infer(self, instr: Instruction, tok: TokenLike) -> None:
        from hlo_passes.verifier.shape_rules import ShapeProblem, infer_shape

        try:
            instr.shape = infer_shape(instr)
        except ShapeProblem as e:
            raise SemanticError(f"failed to infer shape for opcode: {instr.opcode.value}, error: {e}", tok) from None
        except (AttributeError, TypeError, ValueError, IndexError, KeyError) as e:
            raise SemanticError(f"failed to infer shape for opcode: {instr.opcode.value}: {e}", tok) from None

    def _shape_checks(self, instr: Instruction, tok: TokenLike) -> None:
        op, shape = instr.opcode, instr.shape
        if type(shape) is TupleShape and depth(shape) > MAX_TUPLE_DEPTH:
            raise SemanticError(f"tuple shapes are nested more than {MAX_TUPLE_DEPTH} deep (MAX_TUPLE_DEPTH)", tok)
        if "parameter_replication" in instr.attributes:
            n = len(instr.attr("parameter_replication"))
            leaves = len(shape.leaves())
            if n != leaves:
                raise SemanticError(f"parameter has {leaves} leaf buffers, but parameter_replication has {n} "
                                    "elements", tok)
        if op is Opcode.ASYNC_START:
            if type(shape) is not TupleShape or len(shape.elements) < 2 or type(shape.elements[0]) is not TupleShape:
                raise SemanticError("async-start expects the op shape to be in the form of "
                                    "((async-operands), async-outputs, state)", tok)
        elif op is Opcode.ASYNC_UPDATE:
            if _with_default_layouts(shape) != _with_default_layouts(instr.operands[0].shape):
                raise SemanticError("async-update expects the op shape to be the same as the operand shape", tok)
        elif op in (Opcode.INFEED, Opcode.RECV):
            if type(shape) is not TupleShape or not shape.elements:
                raise SemanticError(f"{op.value} must have a non-empty tuple shape", tok)
        elif op is Opcode.CUSTOM_CALL and "operand_layout_constraints" in instr.attributes:
            self._layout_constraints(instr, tok)

    def _layout_constraints(self, instr: Instruction, tok: TokenLike) -> None:
        """One constraint per operand, each compatible with its operand (XLA fills a layout left
        out with the default one, here and on the result, so neither can lack one)."""
        raw = cast(str, instr.attributes["operand_layout_constraints"].raw).strip()[1:-1]  # parsed: has text
        shapes = [parse_shape(part.strip()) for part in schema.split_top_level(raw) if part.strip()]
        if len(shapes) != len(instr.operands):
            raise SemanticError(f"expected {len(instr.operands)} operand layout constraints, {len(shapes)} given", tok)
        for i, (constraint, operand) in enumerate(zip(shapes, instr.operands)):
            if not _compatible(constraint, operand.shape):
                raise SemanticError(f"operand layout constraint shape {constraint.to_hlo()} for operand {i} is not "
                                    f"compatible with operand shape {operand.shape.to_hlo()}", tok)

    # ------------------------------------------------------------ async sugar --
    def _async_sugar(self, instr: Instruction, tok: TokenLike, wrapped: Opcode) -> Instruction:
        """`custom-call-start(p), custom_call_target="x"` → an async-start calling a computation
        whose root is the custom-call, as XLA's parser builds it; -update/-done continue it."""
        if instr.opcode is not Opcode.ASYNC_START:
            return instr
        shape = instr.shape
        if type(shape) is not TupleShape or len(shape.elements) < 2 or type(shape.elements[0]) is not TupleShape:
            raise SemanticError("async-start expects the op shape to be in the form of "
                                "((async-operands), async-outputs, state)", tok)
        span = instr.span  # everything the sugar stands for comes from its line
        comp = Computation("async_wrapped")
        comp.span = span
        params = []
        for i, operand in enumerate(instr.operands):
            p = Instruction(Opcode.PARAMETER, operand.shape, name="async_param" if i == 0 else f"async_param.{i}",
                            parameter_number=i, span=span)
            p.parent = comp
            comp._instructions[p] = None
            params.append(p)
        comp.parameters = params
        async_keys = set(schema.ASYNC_SUGAR_START) | {"sharding", "control-predecessors", "parameter_replication"}
        inner = Instruction(wrapped, shape.elements[1], params, name="async_op",
                            attributes={k: a for k, a in instr.attributes.items() if k not in async_keys},
                            called=dict(instr.called) or None, span=span)
        self._opcode_checks(inner, tok, None)
        self._shape_checks(inner, tok)
        inner.parent = comp
        comp._instructions[inner] = None
        comp.root = inner
        comp.print_signature = False
        thread_attr = instr.attributes.get("async_execution_thread")
        if thread_attr is not None:
            comp.attributes["execution_thread"] = Attr(raw=thread_attr.raw)
        start = Instruction(Opcode.ASYNC_START, shape, name=instr.name,
                            attributes={k: a for k, a in instr.attributes.items()
                                        if k in async_keys or k in ("metadata", "backend_config", "frontend_attributes",
                                                                    "statistics", "origin")},
                            called={"calls": comp}, span=span)
        operands, preds = list(instr.operands), list(instr.control_predecessors)
        instr.drop_operands()  # also unlinks its control predecessors
        start._init_operands(tuple(operands))
        for pred in preds:
            start.add_control_predecessor(pred)
        self.synthesized.append(comp)
        self.pending_computations.append(comp)
        self.async_callers[comp] = start
        self.async_chain[start] = AsyncChain(wrapped, comp, start.attr("async_execution_thread", "main"))
        return start

    # ------------------------------------------------------------- definitions --
    def _define(self, instr: Instruction, name_tok: TokenLike) -> None:
        name = instr.name
        if name in self.by_name:
            raise SemanticError(f"instruction name '{name}' is used twice in computation "
                                f"'{self.computation_name}'", name_tok)
        self.by_name[name] = instr
        self.current.append(instr)

    # ------------------------------------------------------------ computation --
    def param_decl(self, c: list[Any]) -> tuple[TokenLike, Shape]:
        return c[0], c[1]

    def signature(self, c: list[Any]) -> Signature:
        return Signature(c[:-1], c[-1])

    def computation_header(self, c: list[Any]) -> ComputationHeader:
        is_entry = getattr(c[0], "type", None) == "ENTRY"
        if is_entry:
            c = c[1:]
        c = self._drop_header_colon(c, "a signature or '{'")
        self._check_header_name(c[0], "computation")
        header = ComputationHeader(is_entry, c[0], c[1] if len(c) > 1 else None, self.span_of(c[0]))
        self._begin_computation(_bare(header.name.value))
        if self.first_computation is None:
            self.first_computation = header
        return header

    def computation(self, c: list[Any]) -> Computation:
        records = [r for r in c[1:-1] if type(r) is ParsedInstruction]
        return self.finish_computation(c[0], records, c[-1])

    def finish_computation(self, header: ComputationHeader, records: list[ParsedInstruction],
                           attrs: Sequence[tuple[TokenLike, Attr]]) -> Computation:
        is_entry, name_tok, signature, span = header
        name = _bare(name_tok.value)
        if name in self.computations:
            raise SemanticError(f"computation name '{name}' is used twice", name_tok)
        if not records:
            raise SemanticError(f"computation '{name}' has no instructions", name_tok)
        comp = Computation(name, is_entry=is_entry)
        comp.print_signature = signature is not None
        comp.span = unpack_span(span)
        roots = [r for r in records if r.is_root]
        if len(roots) > 1:
            raise SemanticError(f"computation '{name}' has more than one ROOT", span=roots[1].instr.span)
        instructions = comp._instructions
        for instr in self.current:
            instr.parent = comp
            instructions[instr] = None
        if self.params:
            count = len(self.params)
            missing = next((i for i in range(count) if i not in self.params), None)
            if missing is not None:
                raise SemanticError(f"computation '{name}' has no parameter({missing}) (parameters are numbered "
                                    f"0..n-1)", name_tok)
            comp.parameters = [self.params[i] for i in range(count)]
        comp.root = roots[0].instr if roots else records[-1].instr
        for key_tok, attr in attrs:
            key = key_tok.value
            spec = schema.COMPUTATION_KEYS.get(key)
            if spec is None:
                raise SemanticError(f"unexpected attribute '{key}' for a computation; it takes: "
                                    f"{', '.join(schema.COMPUTATION_KEYS)}", key_tok)
            if key in comp.attributes:
                raise SemanticError(f"attribute '{key}' given twice", key_tok)
            try:
                spec.check(cast(str, attr.raw))
            except ValueError as e:
                raise SemanticError(f"error parsing attribute {key}: {e}", key_tok) from None
            comp.attributes[key] = attr
        if signature is not None and self.check_semantics:
            from hlo_passes.verifier.shape_rules import same_shape

            declared = signature.result
            if not same_shape(declared, comp.root.shape):
                raise SemanticError(f"shape of computation {name}, {declared.to_hlo(False)}, is not compatible with "
                                    f"that of its root instruction {comp.root.name}, "
                                    f"{comp.root.shape.to_hlo(False)}", name_tok)
        if is_entry:
            if self.entry is not None:
                raise SemanticError("a module has only one ENTRY computation", name_tok)
            self.entry = comp
        self.order.extend(self.pending_computations)
        self.order.append(comp)
        self.computations[name] = comp
        self._begin_computation("")
        return comp

    # ---------------------------------------------------------------- tables --
    def string_row(self, c: list[Any]) -> Any:
        try:
            return _int_token(c[0]), _unquote(c[1].value)
        except SemanticError as e:
            raise SemanticError(e.message, c[1]) from None

    def record_field(self, c: list[Any]) -> Any:
        return c[0].value, _int_token(c[1])

    def record_row(self, c: list[Any]) -> TableRecord:
        fields = {}
        for key, value in c[1:]:
            if key in fields:
                raise SemanticError(f"field '{key}' given twice", c[0])
            fields[key] = value
        return TableRecord(_int_token(c[0]), fields, c[0])

    def _records(self, c: list[TableRecord], table: str) -> dict[int, dict[str, int]]:
        rows = {}
        for number, fields, tok in c:
            problem = record_problem(table, fields)
            if problem is not None:
                raise SemanticError(problem, tok)
            rows[number] = fields
        return rows

    def file_names_table(self, c: list[Any]) -> DebugTable:
        return DebugTable("file_names", dict(c))

    def function_names_table(self, c: list[Any]) -> DebugTable:
        return DebugTable("function_names", dict(c))

    def file_locations_table(self, c: list[Any]) -> DebugTable:
        return DebugTable("file_locations", self._records(c, "file_locations"))

    def stack_frames_table(self, c: list[Any]) -> DebugTable:
        return DebugTable("stack_frames", self._records(c, "stack_frames"))

    # ---------------------------------------------------------------- module --
    def module_header(self, c: list[Any]) -> ModuleHeader:
        c = self._drop_header_colon(c, "module attributes or a computation")
        self._check_header_name(c[0], "module")
        return ModuleHeader(c[0], c[1])

    @staticmethod
    def _drop_header_colon(c: list[Any], expected: str) -> list[Any]:
        """A header's children without the colon after its name, which must come right after
        it: XLA's lexer reads `name:` as one token and a ':' on its own as none it expects."""
        if len(c) > 1 and isinstance(c[1], Token) and c[1].type == "HEADER_COLON":
            if c[1].start_pos != c[0].end_pos:
                raise SemanticError(f"expects {expected}: the ':' after a name comes right after it", c[1])
            return [c[0], *c[2:]]
        return c

    def _check_header_name(self, tok: TokenLike, what: str) -> None:
        """A module's or computation's name must not be a word XLA's lexer reserves (see
        RESERVED_WORDS), unless a ':' right after it makes the lexer read it as a name."""
        word = tok.value
        if word in RESERVED_WORDS:
            end = cast(int, tok.start_pos) + len(word)
            if self.text[end:end + 1] != ":":
                raise SemanticError(f"expects a {what} name: '{word}' is {_reserved_word(word)} in HLO text "
                                    f"(write '%{word}', or rename it)", tok)

    def module(self, c: list[Any]) -> Module:
        header = c[0] if type(c[0]) is ModuleHeader else None
        return self.finish_module(header, [x for x in c if type(x) is DebugTable])

    def finish_module(self, header: ModuleHeader | None, tables: list[DebugTable]) -> Module:
        name_tok, header_attrs = (header.name, header.attributes) if header is not None else (None, [])
        if header is None and self.first_computation is not None:
            # XLA reads text without a header as a module only when it starts with ENTRY or
            # `name {`; anything else it takes for a single instruction (and refuses here).
            is_entry, first_tok, signature, _ = self.first_computation
            if tables or (not is_entry and signature is not None):
                start = len(self.text) - len(self.text.lstrip())
                raise SemanticError("text without 'HloModule' must start with ENTRY or with a computation "
                                    "written `name {` (add a `HloModule name` line)",
                                    None if tables else first_tok, pos=start)
        module = Module(_bare(name_tok.value) if name_tok is not None else "")
        for key_tok, attr in header_attrs:
            key = key_tok.value
            if key in module.attributes:
                raise SemanticError(f"module attribute '{key}' given twice", key_tok)
            spec = schema.MODULE_KEYS.get(key)
            if spec is None:
                raise SemanticError(f"unexpected module attribute '{key}'; a module takes: "
                                    f"{', '.join(sorted(schema.MODULE_KEYS))}", key_tok)
            raw = cast(str, attr.raw)  # parsed: has text
            try:
                spec.check(raw)
            except ValueError as e:
                raise SemanticError(f"error parsing attribute {key}: {e}", key_tok) from None
            if key in ("replica_count", "num_partitions") and parse_int64(raw) < 1:
                raise SemanticError(f"{key} must be at least 1, got {raw}", key_tok)
            module.attributes[key] = attr
        order = [key for key, _ in tables]
        if order and order != list(TABLE_FIELDS_ORDER):
            bad = next((i for i, key in enumerate(order) if i >= len(TABLE_FIELDS_ORDER)
                        or key != TABLE_FIELDS_ORDER[i]), len(order) - 1)
            title = _TABLE_TITLES[order[bad]]
            nth = order[:bad].count(order[bad])
            found = list(re.finditer(rf"^[ \t]*{title}\b", self.text, re.M))
            expected = _TABLE_TITLES[TABLE_FIELDS_ORDER[bad]] if bad < len(TABLE_FIELDS_ORDER) else "a computation"
            raise SemanticError(f"expects {expected} here: debug tables come as FileNames, FunctionNames, "
                                "FileLocations, StackFrames, each once and in this order",
                                pos=found[nth].start() if nth < len(found) else 0)
        for key, rows in tables:
            setattr(module.tables, key, rows)
        module.style.percent_names = self.percent_names
        module.style.operand_shapes = self.operand_shapes
        if not self.order:
            raise SemanticError("the module has no computation")
        entry = self.entry
        if entry is None:  # XLA takes the last computation as the entry
            entry = self.order[-1]
            entry.is_entry = True
        if not module.name:  # no header: XLA names the module after its entry
            module.name = f"module_{entry.name}"
        taken = set(self.computations)
        for comp in self.synthesized:  # async-wrapped computations get names nobody wrote
            base, n = comp.name, 0
            while comp.name in taken:
                n += 1
                comp.name = f"{base}.{n}"
            taken.add(comp.name)
        for comp in self.order:
            comp.module = module
            module.computations.append(comp)
        module.take_names_of_parsed_instructions()
        module.entry = entry
        module.parsed_entry_signature = entry_signature(module)
        for key_tok, attr in header_attrs:
            if key_tok.value in ("input_output_alias", "buffer_donor"):
                self._check_aliasing(module, key_tok, cast(str, attr.raw))  # parsed: has text
        return module

    def _check_aliasing(self, module: Module, key_tok: TokenLike, raw: str) -> None:
        """Each entry names an existing output index, parameter and parameter index."""
        entry = cast(Computation, module.entry)  # set by finish_module
        if key_tok.value == "input_output_alias":
            for m in schema.ALIAS_ENTRY.finditer(raw):
                out = _shape_index(m.group(1))
                result = cast(Instruction, entry.root).shape
                if _subshape(result, out) is None:
                    raise SemanticError(f"input_output_alias: output index {{{','.join(map(str, out))}}} is not an "
                                        f"index of the result {result.to_hlo(False)}", key_tok)
                self._check_parameter_index(entry, _small_int(m.group(2)), _shape_index(m.group(3)), key_tok)
        else:
            for m in schema.DONOR_ENTRY.finditer(raw):
                self._check_parameter_index(entry, _small_int(m.group(1)), _shape_index(m.group(2)), key_tok)

    def _check_parameter_index(self, entry: Computation, number: int, index: tuple[int, ...],
                               key_tok: TokenLike) -> None:
        what = key_tok.value
        if not 0 <= number < len(entry.parameters):
            raise SemanticError(f"{what}: the entry has no parameter {number}", key_tok)
        if _subshape(entry.parameters[number].shape, index) is None:
            raise SemanticError(f"{what}: {{{','.join(map(str, index))}}} is not an index of parameter {number}, "
                                f"{entry.parameters[number].shape.to_hlo(False)}", key_tok)


# The debug tables of newer dumps, in the order XLA requires them, and the fields of each
# record (all required, no others).
TABLE_FIELDS_ORDER = ("file_names", "function_names", "file_locations", "stack_frames")
_TABLE_TITLES = {"file_names": "FileNames", "function_names": "FunctionNames", "file_locations": "FileLocations",
                 "stack_frames": "StackFrames"}
TABLE_FIELDS = {
    "file_locations": ("file_name_id", "function_name_id", "line", "end_line", "column", "end_column"),
    "stack_frames": ("file_location_id", "parent_frame_id"),
}


def _check_extent(shape: Shape, tok: TokenLike) -> None:
    """A literal's arrays hold at most INT64_MAX bytes (XLA, which allocates the literal, refuses a
    larger one: "overflow in static extent product")."""
    stack = [shape]
    while stack:
        s = stack.pop()
        if type(s) is TupleShape:
            stack.extend(s.elements)
        elif type(s) is ArrayShape:
            n = s.element_type.byte_size if s.element_type.is_array else 1
            for d in s.dims:
                n *= max(d, 0)
            if n > INT64_MAX:
                raise SemanticError(f"overflow in static extent product: a constant of shape {s.to_hlo()} would "
                                    "take more than 2^63-1 bytes", tok)


def record_problem(table: str, fields: dict[str, int]) -> str | None:
    """What is wrong with one record of a FileLocations or StackFrames table, or None."""
    keys = TABLE_FIELDS[table]
    for key in fields:
        if key not in keys:
            return f"unexpected field '{key}' in {_TABLE_TITLES[table]}; fields are {', '.join(keys)}"
    for key in keys:
        if key not in fields:
            return f"{_TABLE_TITLES[table]} record needs {key}="
    for key, value in fields.items():
        if not -(1 << 31) <= value < (1 << 31):
            return f"{key}={value} is out of range for int32"
    return None


def _int_token(tok: TokenLike) -> int:
    try:
        return parse_int64(tok.value)
    except ValueError as e:
        raise SemanticError(str(e), tok) from None


def _shape_index(text: str) -> tuple[int, ...]:
    body = text.strip()[1:-1]
    return tuple(_small_int(x) for x in body.split(",") if x.strip())


def _small_int(text: str) -> int:
    """An index from an attribute (its syntax checked): past int64 it cannot name anything."""
    text = text.strip()
    return int(text) if len(text) <= 19 else (1 << 63)


def _subshape(shape: Shape, index: tuple[int, ...]) -> Shape | None:
    for i in index:
        if type(shape) is not TupleShape or not 0 <= i < len(shape.elements):
            return None
        shape = shape.elements[i]
    return shape


def _compatible(a: Shape, b: Shape) -> bool:
    """XLA's ShapeUtil::Compatible: equal dimensions and element types, layouts ignored."""
    from hlo_passes.verifier.shape_rules import same_shape

    return same_shape(a, b)


def _with_default_layouts(shape: Shape) -> Shape:
    """`shape` with XLA's default layout wherever none is written (as XLA's parser fills them)."""
    if type(shape) is TupleShape:
        return TupleShape(tuple(_with_default_layouts(e) for e in shape.elements))
    array = cast(ArrayShape, shape)
    if array.layout is None:
        return ArrayShape(array.element_type, array.dims, array.dynamic, Layout.default_for_rank(len(array.dims)),
                          array.unbounded)
    return shape


def _unquote(s: str) -> str:
    from hlo_passes.parse.strings import unquote

    try:
        return unquote(s)
    except ValueError as e:
        raise SemanticError(str(e)) from None


def entry_signature(module: Module) -> tuple[tuple[Shape, ...], Shape]:
    entry = cast(Computation, module.entry)  # a parsed module has an entry with a root
    return (tuple(p.shape for p in entry.parameters), cast(Instruction, entry.root).shape)


@dataclass(frozen=True, slots=True)
class _Keys:
    """The attribute keys an instruction takes (its opcode's and everyone's), and the required ones."""

    checks: dict[str, Callable[[str], None]]  # key -> how its value reads; never written once made
    required: tuple[str, ...]

    @staticmethod
    def of(own: dict[str, schema.Spec]) -> "_Keys":
        return _Keys({k: spec.check for k, spec in {**schema.COMMON, **own}.items()},
                     tuple(k for k, spec in own.items() if spec.required))


@dataclass(frozen=True, slots=True)
class _Plan:
    """What `_build` needs to know about one opcode spelling, worked out once per spelling."""

    opcode: Opcode
    wrapped: Opcode | None  # the op an `op-start`/`-update`/`-done` spelling wraps
    keys: _Keys
    dynamic_keys: bool  # the keys depend on the operands (conditional, broadcast)
    literal: bool  # constant, parameter: the operands are a literal
    low: int  # operand count bounds (high None: no bound), and parity (None: any)
    high: int | None
    parity: int | None
    references: bool  # some key names computations or control predecessors
    checks: bool  # `_opcode_checks` has something to check
    shape_checks: bool

    @staticmethod
    def of(opcode: Opcode, wrapped: Opcode | None) -> "_Plan":
        from hlo_passes.verifier.shape_rules import OPERAND_COUNTS

        if wrapped is None:
            own = schema.OPCODE_KEYS[opcode]
        elif opcode is Opcode.ASYNC_START:
            own = {**schema.OPCODE_KEYS[wrapped], **schema.ASYNC_SUGAR_START}
        else:
            own = schema.ASYNC_SUGAR_OTHER
        keys = _Keys.of(own)
        low, high = OPERAND_COUNTS.get(opcode, (0, None)) if wrapped is None else (0, None)
        parities = {Opcode.REDUCE: 0, Opcode.REDUCE_WINDOW: 0, Opcode.SCATTER: 1}
        return _Plan(
            opcode=opcode, wrapped=wrapped, keys=keys,
            dynamic_keys=wrapped is None and opcode in (Opcode.CONDITIONAL, Opcode.BROADCAST),
            literal=opcode in (Opcode.CONSTANT, Opcode.PARAMETER),
            low=low, high=high, parity=parities.get(opcode) if wrapped is None else None,
            references=opcode is Opcode.CONDITIONAL or any(
                k in CALLED_COMPUTATION_KEYS or k == "control-predecessors" for k in keys.checks),
            checks=wrapped is not None or opcode in _CHECKED_OPCODES,
            shape_checks=opcode in (Opcode.ASYNC_START, Opcode.ASYNC_UPDATE, Opcode.INFEED, Opcode.RECV,
                                    Opcode.CUSTOM_CALL))


_CHECKED_OPCODES = frozenset({
    Opcode.CONDITIONAL, Opcode.SORT, Opcode.CONCATENATE, Opcode.GET_DIMENSION_SIZE, Opcode.SET_DIMENSION_SIZE,
    Opcode.ALL_GATHER, Opcode.ALL_GATHER_START, Opcode.REDUCE_SCATTER, Opcode.SCAN, Opcode.ALL_TO_ALL,
    Opcode.DYNAMIC_SLICE, Opcode.DYNAMIC_UPDATE_SLICE, Opcode.COLLECTIVE_PERMUTE, Opcode.COLLECTIVE_PERMUTE_START,
    Opcode.RECV_DONE, Opcode.SEND_DONE, Opcode.ASYNC_UPDATE, Opcode.ASYNC_DONE, Opcode.ASYNC_START,
    Opcode.RNG_BIT_GENERATOR, Opcode.DYNAMIC_RESHAPE,
})
_CONDITIONAL_PRED_KEYS = _Keys.of(schema.CONDITIONAL_PRED)
_CONDITIONAL_INDEX_KEYS = _Keys.of(schema.CONDITIONAL_INDEX)
_BROADCAST_ARRAY_KEYS = _Keys.of({"dimensions": schema.req(schema.check_int_list)})


class _UnknownOpcode(ValueError):
    """An opcode spelling that names no opcode (the message says why)."""


# Shared by every parse and thread: a pure function of the spelling, returning a frozen plan.
@functools.lru_cache(maxsize=4096)
def _plan_of(text: str) -> _Plan:
    opcode = OPCODES_BY_NAME.get(text)
    if opcode is not None:
        return _Plan.of(opcode, None)
    for suffix, async_opcode in _ASYNC_SUFFIXES:
        if text.endswith(suffix):
            wrapped = OPCODES_BY_NAME.get(text[: -len(suffix)])
            if wrapped is None:
                raise _UnknownOpcode(f"expects async wrapped opcode but sees: {quote(text)}")
            if wrapped in (Opcode.ASYNC_START, Opcode.ASYNC_UPDATE, Opcode.ASYNC_DONE):
                raise _UnknownOpcode(f"{quote(text)}: an async op cannot wrap another one")
            return _Plan.of(async_opcode, wrapped)
    raise _UnknownOpcode(f"unknown opcode {quote(text)}")


# (check, value text) pairs that passed, shared by every parse and thread: the checks are pure
# functions of the text (a failure raises and is not cached).  Metadata and shardings repeat a
# lot, and across the modules of a dump.
@functools.lru_cache(maxsize=1 << 17)
def _check_value(check: Callable[[str], None], raw: str) -> None:
    check(raw)


# Values XLA reads field by field, each field `name=value` with `name=` one token (the lexer's
# attribute name); others, such as backend_config={...}, it keeps as text.
_NAMED_FIELD_KEYS = frozenset({"sharding", "metadata", "frontend_attributes", "window"})


_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"|\'[^\']*\'')
_SPACED_NAME = re.compile(r"(?<![\w.\-])([A-Za-z_][\w.\-]*)\s+=")


def _check_names_before_equals(raw: str, top_level_only: bool = False) -> None:
    """Inside a value too (`metadata={op_name="x"}`, `sharding={maximal device=0}`), XLA's lexer
    reads `name=` as one token: a name apart from its '=' is refused.  `top_level_only`: only the
    value's own fields (a frontend attribute's `{...}` value is kept as text, as in Shardy's
    `xla.sdy.meshes={mesh = #sdy.mesh<...>}`)."""
    text = _QUOTED.sub('""', raw)
    if top_level_only:
        kept, depth = [], 0
        for ch in text:
            depth -= ch in "}])"
            if depth <= 1:
                kept.append(ch)
            depth += ch in "{[("
        text = "".join(kept)
    m = _SPACED_NAME.search(text)
    if m is not None:
        raise ValueError(f"expects attribute name: write '=' right after {quote(m.group(1))}, with no space "
                         "before it")


def parse_module(text: str, filename: str | None = None, *, engine: str = "auto",
                 check_semantics: bool = True) -> Module:
    """Parse HLO module text; raises HloParseError with file:line:col on any error.

    filename: where the text comes from, for error messages and the instructions' spans
    (None: not from a file; errors say `<input>`).
    engine: "auto" reads XLA-printed text line by line (see line_scanner) and
    falls back to the full grammar for anything else; "lark" always uses the
    full grammar; "fast" fails instead of falling back (for tests).
    check_semantics: reject operand counts and shapes that XLA rejects (the
    verifier's per-opcode rules); False reads such modules anyway, e.g. to test
    the verifier on them.

    Each call has its own builder, so calls may run on several threads at once.
    """
    if engine not in ("auto", "lark", "fast"):
        raise ValueError(f"unknown parser engine {engine!r}")
    if "\r" in text:  # XLA reads CR LF and a lone CR (old Mac files) as line ends too
        text = _line_ends(text)
    # Building a module allocates hundreds of thousands of objects and no garbage
    # cycles; the cyclic collector would rescan them all many times over.  (The switch is
    # the process's: with parses on several threads, the first to finish may turn it back
    # on under the others, which then only run slower.)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        module = _parse(text, filename, engine, check_semantics)
        if check_semantics:
            _check_semantics(module, text, filename)
        return module
    finally:
        if gc_was_enabled:
            gc.enable()


_CR_OR_SKIPPED = re.compile(r'"(?:[^"\\]|\\.)*"|/\*.*?\*/|//[^\n\r]*|\r\n?', re.S)


def _line_ends(text: str) -> str:
    """`text` with CR LF and lone CR made LF, except inside strings (and comments), where a CR
    is a character of the string, as XLA's lexer keeps it."""
    return _CR_OR_SKIPPED.sub(lambda m: "\n" if m.group()[0] == "\r" else m.group(), text)


def _parse(text: str, filename: str | None, engine: str, check_semantics: bool) -> Module:
    try:
        if engine != "lark":
            try:
                return LineScanner(ModuleBuilder(text, filename, check_semantics), text).scan()
            except Fallback:
                if engine == "fast":
                    raise
        builder = ModuleBuilder(text, filename, check_semantics)
        return cast(Module, grammar.InlineParser(builder).parse(text, "module"))  # built inline
    except SemanticError as e:
        if e.span is not None:
            raise _error_at(text, e.message, e.span) from None
        pos = e.token.start_pos if e.token is not None and hasattr(e.token, "start_pos") else e.pos
        if pos is None and "MAX_TUPLE_DEPTH" in e.message:
            pos = _deep_tuple_position(text)
        raise _error(text, filename, pos if pos is not None else 0, e.message) from None
    except lark.exceptions.UnexpectedInput as e:
        raise _lark_error(text, filename, e) from None
    except RecursionError:  # a guard, should a limit above be missing
        raise _error(text, filename, 0, "the text is nested too deeply to read") from None


_PAREN_OR_SKIPPED = re.compile(r'"(?:[^"\\]|\\.)*"|/\*.*?\*/|//[^\n]*|[()]', re.S)


def _deep_tuple_position(text: str) -> int | None:
    """Where the first tuple nested more than MAX_TUPLE_DEPTH deep opens: the '(' that many tuple
    parentheses deep (a '(' right after a name opens an operand list, which tuples do not count)."""
    runs = [0]  # per open '(': how many tuple parentheses deep it is
    for m in _PAREN_OR_SKIPPED.finditer(text):
        if m.group() == "(":
            j = m.start() - 1
            while j >= 0 and text[j] in " \t\r\n":
                j -= 1
            before = text[j] if j >= 0 else ""
            run = 0 if before and (before.isalnum() or before in "_.-%") else runs[-1] + 1
            if run > MAX_TUPLE_DEPTH:
                return m.start()
            runs.append(run)
        elif m.group() == ")" and len(runs) > 1:
            runs.pop()
    return None


def _check_semantics(module: Module, text: str, filename: str | None) -> None:
    """Operand counts and shapes, per opcode (hlo_passes.verifier's rules)."""
    from hlo_passes.verifier import first_semantic_problem

    found = first_semantic_problem(module)
    if found is not None:
        instr, message = found
        message = f"'{instr.name}' {message}"
        span = instr.span or (instr.parent.span if instr.parent is not None else None)
        if span is None:  # pragma: no cover - the parser gives every instruction a span
            raise _error(text, filename, 0, message)
        raise _error_at(text, message, span)


def _error(text: str, filename: str | None, pos: int, message: str) -> HloParseError:
    line, col, source = position_of(text, pos)
    return HloParseError(message, filename=filename or "<input>", line=line, column=col, source_line=source)


def _error_at(text: str, message: str, span: SourceSpan) -> HloParseError:
    return HloParseError(message, filename=span.file or "<input>", line=span.line, column=span.column,
                         source_line=line_at(text, span.line))


def _lark_error(text: str, filename: str | None, e: lark.exceptions.UnexpectedInput) -> HloParseError:
    pos, message = lark_error_message(text, e)
    return _error(text, filename, pos, message)


def lark_error_message(text: str, e: lark.exceptions.UnexpectedInput) -> tuple[int, str]:
    """(offset, "expected X, got Y") of a syntax error the grammar found in `text`."""
    pos = getattr(e, "pos_in_stream", None)
    if isinstance(e, lark.exceptions.UnexpectedToken):
        tok = e.token
        pos = tok.start_pos if tok.start_pos is not None and tok.type != "$END" else len(text)
        got = "end of input" if tok.type == "$END" else quote(tok.value)
        expected = sorted({grammar.terminal_description(t) for t in e.expected if t != "$END"})
        if "$END" in e.expected:
            expected.append("end of input")
        message = f"expected {_one_of(expected)}, got {got}" if expected else f"unexpected {got}"
    elif isinstance(e, lark.exceptions.UnexpectedCharacters):
        pos = cast(int, e.pos_in_stream)  # set on every UnexpectedCharacters
        expected = sorted({grammar.terminal_description(t) for t in (e.allowed or ())})
        message = f"unexpected character {quote(text[pos])}" + (
            f"; expected {_one_of(expected)}" if expected else "")
    elif isinstance(e, lark.exceptions.UnexpectedEOF):
        pos = len(text)
        message = "unexpected end of input"
    else:
        message = str(e).splitlines()[0] if str(e) else "syntax error"
    return pos or 0, message


def _one_of(items: list[str]) -> str:
    if len(items) == 1:
        return items[0]
    return "one of " + ", ".join(items)


def _mesh_device_ids_joined(attrs: Sequence[tuple[TokenLike, Attr]]) -> Sequence[tuple[TokenLike, Attr]]:
    """XLA prints mesh-form replica groups over a mesh with its own device order as
    `replica_groups=mesh['x'=1,'y'=2], device_ids=(1,0) {'y'}`: the comma inside the value
    reads as the start of an attribute `device_ids`, given back to the replica groups here."""
    if not any(k.value == "device_ids" for k, _ in attrs):
        return attrs
    out: list[tuple[TokenLike, Attr]] = []
    for key_tok, attr in attrs:
        if (key_tok.value == "device_ids" and out and out[-1][0].value == "replica_groups"
                and cast(str, out[-1][1].raw).lstrip().startswith("mesh")):
            prev_tok, prev = out[-1]
            out[-1] = (prev_tok, Attr(raw=f"{prev.raw}, device_ids={attr.raw}"))
        else:
            out.append((key_tok, attr))
    return out
