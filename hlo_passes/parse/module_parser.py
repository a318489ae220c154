"""Text → IR: runs the Lark grammar and builds Module / Computation / Instruction.

The builder is a Lark Transformer applied inline by the LALR parser, so no parse
tree is kept for the (large) module.  Attribute values are kept as their exact
source text and read into typed values on demand (see attribute_reader).
Names are resolved after each computation (operands may be used before they are
defined, as in XLA) and called computations after the whole module.
"""

from __future__ import annotations

import gc
import threading
from sys import intern

import lark
from lark import Token

from hlo_passes.ir.attributes import Attr
from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import CALLED_COMPUTATION_KEYS, NO_CALLS, Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import OPCODES_BY_NAME, Opcode
from hlo_passes.ir.shape import ArrayShape, Layout, TupleShape
from hlo_passes.ir.types import PRIMITIVE_TYPES_BY_NAME
from hlo_passes.parse import attribute_reader  # noqa: F401 - registers the readers the IR reads attributes with
from hlo_passes.parse import grammar
from hlo_passes.parse.errors import HloParseError, SemanticError, position_of
from hlo_passes.parse.line_scanner import strip_comments

_LITERAL_NAMES = {"true", "false", "nan", "inf", "-inf", "-nan"}


def _span(item) -> tuple[int, int]:
    if isinstance(item, Token):
        return item.start_pos, item.end_pos
    return item


def _bare(name: str) -> str:
    return name[1:] if name.startswith("%") else name


# Attributes that name other computations or instructions, resolved once the module is read.
_REFERENCE_KEYS = frozenset(CALLED_COMPUTATION_KEYS) | {"control-predecessors"}


class _PendingInstruction:
    """An instruction whose operands are not resolved yet (its computation is still being read).

    operand_refs: per operand, its name (a lark Token with its position on the grammar path,
    a plain str from the line scanner; `%t#1` for a tuple element) or the Instruction itself
    (nested operands, and names the line scanner already resolved).
    attrs: the (key token, Attr) pairs that name computations or control predecessors.
    extra: nested instructions to add before this one.
    Only the few with `attrs` outlive their computation, so a large module's pendings never
    all exist at once.
    """

    __slots__ = ("instr", "name_token", "operand_refs", "attrs", "is_root", "extra")

    def __init__(self, instr: Instruction, name_token, operand_refs: list, attrs, extra):
        self.instr = instr
        self.name_token = name_token
        self.operand_refs = operand_refs
        self.attrs = attrs
        self.is_root = False
        self.extra = extra


class _Builder(lark.Transformer):
    """Inline LALR callbacks.  `text` and `module` are set per parse (under a lock)."""

    def __init__(self) -> None:
        super().__init__(visit_tokens=False)
        self.text = ""
        self.nested_counter = 0
        self.anonymous_names: dict[str, int] = {}
        self.percent_names = False
        self.operand_shapes = False
        # (key, text) -> Attr: one slot for every repeat of an attribute (metadata repeats a lot).
        self.attr_slots: dict[tuple[str, str], Attr] = {}
        # The instructions of the computation being read, by name, as they are read.
        self.by_name: dict[str, Instruction] = {}
        self.computation_name = ""

    # --------------------------------------------------------------- shapes --
    def static_dim(self, c):
        return int(c[0]), False, False

    def bounded_dim(self, c):
        return int(c[0]), True, False

    def unbounded_dim(self, c):
        return -1, False, True

    def layout(self, c):
        tok = c[0]
        body = tok.value[1:-1]
        m2m, _, extras = body.partition(":")
        dims = tuple(int(x) for x in m2m.replace(" ", "").split(",") if x)
        return Layout(dims, extras)

    def array_shape(self, c):
        type_tok = c[0]
        etype = PRIMITIVE_TYPES_BY_NAME.get(type_tok.value)
        if etype is None:
            raise SemanticError(f"unknown element type '{type_tok.value}'", type_tok)
        layout = c[-1] if c and isinstance(c[-1], Layout) else None
        dims = [d for d in c[1:] if isinstance(d, tuple)]
        return ArrayShape(etype, tuple(d[0] for d in dims),
                          tuple(d[1] for d in dims) if any(d[1] for d in dims) else (),
                          layout, tuple(d[2] for d in dims) if any(d[2] for d in dims) else ())

    def tuple_shape(self, c):
        return TupleShape(tuple(c))

    # ------------------------------------------------------------- literals --
    def literal_scalar(self, c):
        return ("lit", _span(c[0]))

    def _literal_span(self, c):
        return _span(c[0])[0], _span(c[-1])[1]

    def literal_braces(self, c):
        return self._literal_span(c)

    def literal_paren(self, c):
        return self._literal_span(c)

    # -------------------------------------------------------------- operands --
    def operand_ref(self, c):
        return c[0]  # the name token; a ref is a str, literals and nested operands are tuples

    def typed_operand_ref(self, c):
        self.operand_shapes = True
        return c[1]

    def nested_instruction(self, c):
        shape, opcode_tok, operands = c[0], c[1], c[2]
        return ("nested", shape, opcode_tok, operands)

    def operand(self, c):  # a literal reached through `operand`
        item = c[0]
        return item if isinstance(item[0], str) else ("lit", item)

    def operand_list(self, c):
        return c

    # ------------------------------------------------------------ attributes --
    def group(self, c):
        return _span(c[0])[0], _span(c[-1])[1]

    inner_group = group

    def attr_value(self, c):
        start, end = _span(c[0])[0], _span(c[-1])[1]
        return strip_comments(self.text[start:end])

    def attribute(self, c):
        return c[0], Attr(raw=c[1])

    def instruction_attrs(self, c):
        return c

    computation_attrs = instruction_attrs
    module_attrs = instruction_attrs

    # ----------------------------------------------------------- instruction --
    def instruction(self, c):
        is_root = isinstance(c[0], Token) and c[0].type == "ROOT"
        if is_root:
            c = c[1:]
        name_tok, shape, opcode_tok, operands, attrs = c
        if name_tok.value.startswith("%"):
            self.percent_names = True
        pending = self._make_instruction(_bare(name_tok.value), shape, opcode_tok, operands, attrs, name_tok)
        pending.is_root = is_root
        self._define(pending)
        return pending

    def _define(self, pending: _PendingInstruction) -> None:
        """Make a top-level instruction of the current computation known by its name."""
        name = pending.instr.name
        if name in self.by_name:
            raise SemanticError(f"instruction name '{name}' is used twice in computation "
                                f"'{self.computation_name}'", pending.name_token)
        self.by_name[name] = pending.instr

    def _make_instruction(self, name, shape, opcode_tok, operands, attrs, name_tok) -> _PendingInstruction:
        if name in PRIMITIVE_TYPES_BY_NAME:  # XLA's lexer reads these as element types
            raise SemanticError(f"illegal instruction name '{name}': it is an element type "
                                f"(rename it, e.g. to '{name}_')", name_tok)
        opcode = OPCODES_BY_NAME.get(opcode_tok.value)
        if opcode is None:
            raise SemanticError(f"unknown opcode '{opcode_tok.value}'", opcode_tok)
        instr = Instruction(opcode, shape, name=name)
        refs, extra = operands, ()
        if opcode is Opcode.CONSTANT:
            if not operands:
                raise SemanticError("constant needs a literal, as in constant(0)", opcode_tok)
            start = self._operand_span(operands[0])[0]
            end = self._operand_span(operands[-1])[1]
            instr.literal = self.text[start:end]
            refs = ()
        elif opcode is Opcode.PARAMETER:
            if len(operands) != 1 or isinstance(operands[0], str) or operands[0][0] != "lit":
                raise SemanticError("parameter needs its number, as in parameter(0)", opcode_tok)
            s, e = self._operand_span(operands[0])
            try:
                instr.parameter_number = int(self.text[s:e])
            except ValueError:
                raise SemanticError("parameter number must be an integer", pos=s) from None
            refs = ()
        else:
            for op in operands:
                if not isinstance(op, (str, Instruction)):
                    refs, extra = self._nested_operands(opcode, operands)
                    break
            # else: the caller's fresh list of names becomes the operand list
        references = ()
        if attrs:
            slots = self.attr_slots
            attributes = instr.attributes
            for key_tok, attr in attrs:
                key = intern(key_tok.value)  # one string per key, not one per use
                if key in attributes:
                    raise SemanticError(f"attribute '{key}' given twice", key_tok)
                attributes[key] = slots.setdefault((key, attr.raw), attr)
                if key in _REFERENCE_KEYS:
                    references = [*references, (key_tok, attr)]
        return _PendingInstruction(instr, name_tok, refs, references, extra)

    def _nested_operands(self, opcode: Opcode, operands: list) -> tuple[list, list]:
        """Operand refs and the nested instructions (added before their user) of `operands`."""
        refs, extra = [], []
        for op in operands:
            if isinstance(op, (str, Instruction)):
                refs.append(op)
            elif op[0] == "nested":
                _, nshape, nop_tok, noperands = op
                nested = self._make_instruction(self._anonymous_name(nop_tok.value),
                                                nshape, nop_tok, noperands, [], nop_tok)
                extra.extend(nested.extra)
                extra.append(nested)
                refs.append(nested.instr)
            else:
                raise SemanticError(f"{opcode.value} expects operand names, got a literal",
                                    pos=self._operand_span(op)[0])
        return refs, extra

    def _tuple_element(self, comp, tuple_instr, index, tok, cache) -> Instruction:
        """`%call#1` — XLA's shorthand for element 1 of a tuple — as the get-tuple-element
        XLA's parser makes of it (named `call_1`, added just before its first user)."""
        key = (tuple_instr, index)
        if key not in cache:
            shape = tuple_instr.shape
            if not isinstance(shape, TupleShape) or not 0 <= index < len(shape.elements):
                raise SemanticError(f"'{tuple_instr.name}' has no tuple element {index}", tok)
            gte = Instruction(Opcode.GET_TUPLE_ELEMENT, shape.elements[index], [tuple_instr],
                              name=f"{tuple_instr.name}_{index}")
            gte.set_attr("index", index)
            gte.parent = comp
            comp._instructions[gte] = None
            cache[key] = gte
        return cache[key]

    def _anonymous_name(self, opcode: str) -> str:
        """XLA's name for a nested (anonymous) instruction: `negate.anon`, `negate.anon.1`, ..."""
        self.nested_counter += 1
        base = f"{opcode}.anon"
        n = self.anonymous_names.get(base, 0)
        self.anonymous_names[base] = n + 1
        return base if n == 0 else f"{base}.{n}"

    def _operand_span(self, op):
        if isinstance(op, str):  # a name token, e.g. constant(true)
            return op.start_pos, op.end_pos
        return op[1]

    # ------------------------------------------------------------ computation --
    def param_decl(self, c):
        return c[0], c[1]

    def signature(self, c):
        return ("signature", c[:-1], c[-1])

    def computation_header(self, c):
        is_entry = getattr(c[0], "type", None) == "ENTRY"
        if is_entry:
            c = c[1:]
        signature = c[1] if len(c) > 1 else None
        self.computation_name = _bare(c[0].value)
        self.by_name = {}
        return is_entry, c[0], signature

    def computation(self, c):
        is_entry, name_tok, signature = c[0]
        attrs = c[-1]
        pendings = c[1:-1]
        comp = Computation(_bare(name_tok.value), is_entry=is_entry)
        comp.print_signature = signature is not None
        by_name, self.by_name = self.by_name, {}
        ordered: list[_PendingInstruction] = []
        for p in pendings:
            if p.extra:
                ordered.extend(p.extra)
            ordered.append(p)
        element_refs: dict = {}
        roots = [p for p in ordered if p.is_root]
        if len(roots) > 1:
            raise SemanticError(f"computation '{comp.name}' has more than one ROOT", roots[1].name_token)
        instructions = comp._instructions
        for p in ordered:
            instr = p.instr
            refs = p.operand_refs
            if refs:
                for i, ref in enumerate(refs):
                    if type(ref) is not Instruction:
                        refs[i] = self._operand(comp, ref, by_name, element_refs)
                instr._init_operands(refs)
            instr.parent = comp
            instructions[instr] = None
            if instr.opcode is Opcode.PARAMETER:
                n = instr.parameter_number
                if n < len(comp.parameters) and comp.parameters[n] is not None:
                    raise SemanticError(f"parameter number {n} is used twice in computation "
                                        f"'{comp.name}'", p.name_token)
                comp._register_parameter(instr)
        if any(x is None for x in comp.parameters):
            missing = comp.parameters.index(None)
            raise SemanticError(f"computation '{comp.name}' has no parameter({missing})", name_tok)
        comp.root = roots[0].instr if roots else ordered[-1].instr
        for key_tok, attr in attrs:
            comp.attributes[key_tok.value] = attr
        if signature is not None:
            params = signature[1]
            if len(params) != len(comp.parameters):
                raise SemanticError(f"signature of '{comp.name}' declares {len(params)} parameters, "
                                    f"the body has {len(comp.parameters)}", name_tok)
        # Only instructions that name computations or control predecessors wait for the module.
        return ("computation", comp, name_tok, [p for p in ordered if p.attrs])

    def _operand(self, comp, ref: str, by_name, element_refs) -> Instruction:
        """The instruction an operand name refers to (`%t#1`: element 1 of tuple `t`)."""
        target = by_name.get(ref)
        if target is not None:
            return target
        name, _, index = _bare(ref).partition("#")
        target = by_name.get(name)
        if target is None:
            raise SemanticError(f"'{name}' is not defined in computation '{comp.name}'", ref)
        if index:
            return self._tuple_element(comp, target, int(index), ref, element_refs)
        return target

    # ---------------------------------------------------------------- tables --
    def string_row(self, c):
        return int(c[0]), _unquote(c[1].value)

    def record_field(self, c):
        return c[0].value, int(c[1])

    def record_row(self, c):
        return int(c[0]), dict(c[1:])

    def file_names_table(self, c):
        return ("file_names", dict(c))

    def function_names_table(self, c):
        return ("function_names", dict(c))

    def file_locations_table(self, c):
        return ("file_locations", dict(c))

    def stack_frames_table(self, c):
        return ("stack_frames", dict(c))

    # ---------------------------------------------------------------- module --
    def module_header(self, c):
        return ("header", c[0], c[1])

    def module(self, c):
        if isinstance(c[0], tuple) and c[0][0] == "header":
            _, name_tok, header_attrs = c[0]
            c = [name_tok, header_attrs, *c[1:]]
        else:
            c = [None, [], *c]
        module = Module(_bare(c[0].value) if c[0] is not None else "")
        for key_tok, attr in c[1]:
            if key_tok.value in module.attributes:
                raise SemanticError(f"module attribute '{key_tok.value}' given twice", key_tok)
            module.attributes[key_tok.value] = attr
        comps = []
        for item in c[2:]:
            if item[0] == "computation":
                comps.append(item)
            else:
                setattr(module.tables, item[0], item[1])
        module.style.percent_names = self.percent_names
        module.style.operand_shapes = self.operand_shapes
        by_name: dict[str, Computation] = {}
        entry = None
        for _, comp, name_tok, _ in comps:
            if comp.name in by_name:
                raise SemanticError(f"computation name '{comp.name}' is used twice", name_tok)
            by_name[comp.name] = comp
            if comp.is_entry:
                if entry is not None:
                    raise SemanticError("a module has only one ENTRY computation", name_tok)
                entry = comp
        if entry is None:  # XLA takes the last computation as the entry
            entry = comps[-1][1]
            entry.is_entry = True
        if not module.name:  # no header: XLA names the module after its entry
            module.name = f"module_{entry.name}"
        for _, comp, _, referring in comps:
            comp.module = module
            module.computations.append(comp)
            for p in referring:
                self._resolve_references(p, by_name, comp)
        module.take_names_of_parsed_instructions()
        module.entry = entry
        module.parsed_entry_signature = entry_signature(module)
        return module

    def _resolve_references(self, p: _PendingInstruction, by_name, comp) -> None:
        if p.instr.called is NO_CALLS and any(k.value in CALLED_COMPUTATION_KEYS for k, _ in p.attrs):
            p.instr.called = {}
        for key_tok, attr in p.attrs:
            key = key_tok.value
            if key in CALLED_COMPUTATION_KEYS:
                names = _computation_names(attr.raw)
                missing = [n for n in names if n not in by_name]
                if missing:
                    raise SemanticError(f"computation '{missing[0]}' is not defined", key_tok)
                called = tuple(by_name[n] for n in names)
                list_form = attr.raw.strip().startswith("{")
                p.instr.called[key] = called if list_form else called[0]
            elif key == "control-predecessors":
                local = {i.name: i for i in comp.instructions}
                for n in _computation_names(attr.raw):
                    if n not in local:
                        raise SemanticError(f"control predecessor '{n}' is not defined in "
                                            f"'{comp.name}'", key_tok)
                    p.instr.add_control_predecessor(local[n])


def _computation_names(raw: str) -> list[str]:
    body = raw.strip()
    if body.startswith("{"):
        body = body[1:-1]
    return [_bare(x.strip()) for x in body.split(",") if x.strip()]


def _unquote(s: str) -> str:
    import json

    return json.loads(s)


def entry_signature(module: Module) -> tuple:
    entry = module.entry
    return (tuple(p.shape for p in entry.parameters), entry.root.shape)


_lock = threading.Lock()
_builder = _Builder()


def _reset_builder(text: str) -> None:
    _builder.text = text
    _builder.nested_counter = 0
    _builder.anonymous_names = {}
    _builder.percent_names = False
    _builder.operand_shapes = False
    _builder.attr_slots = {}
    _builder.by_name = {}


def parse_module(text: str, filename: str = "<input>", *, engine: str = "auto",
                 check_semantics: bool = True) -> Module:
    """Parse HLO module text; raises HloParseError with file:line:col on any error.

    engine: "auto" reads XLA-printed text line by line (see line_scanner) and
    falls back to the full grammar for anything else; "lark" always uses the
    full grammar; "fast" fails instead of falling back (for tests).
    check_semantics: reject operand counts and shapes that XLA rejects (the
    verifier's per-opcode rules); False reads such modules anyway, e.g. to test
    the verifier on them.
    """
    if engine not in ("auto", "lark", "fast"):
        raise ValueError(f"unknown parser engine {engine!r}")
    # Building a module allocates hundreds of thousands of objects and no garbage
    # cycles; the cyclic collector would rescan them all many times over.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        module = _parse_locked(text, filename, engine)
        if check_semantics:
            _check_semantics(module, text, filename)
        return module
    finally:
        if gc_was_enabled:
            gc.enable()


def _parse_locked(text: str, filename: str, engine: str) -> Module:
    with _lock:
        if engine != "lark":
            from hlo_passes.parse.line_scanner import Fallback, LineScanner

            _reset_builder(text)
            try:
                return LineScanner(_builder, text).scan()
            except (Fallback, SemanticError, lark.exceptions.LarkError):
                if engine == "fast":
                    raise
            finally:
                _builder.text = ""
                _builder.attr_slots = {}
                _builder.by_name = {}
        _reset_builder(text)
        try:
            return grammar.lark_parser(_builder).parse(text, start="module")
        except SemanticError as e:
            pos = e.token.start_pos if e.token is not None else (e.pos or 0)
            raise _error(text, filename, pos, e.message) from None
        except lark.exceptions.UnexpectedInput as e:
            raise _lark_error(text, filename, e) from None
        finally:
            _builder.text = ""
            _builder.attr_slots = {}
            _builder.by_name = {}


def _check_semantics(module: Module, text: str, filename: str) -> None:
    """Operand counts and shapes, per opcode (hlo_passes.verifier's rules)."""
    from hlo_passes.verifier import first_semantic_problem

    found = first_semantic_problem(module)
    if found is not None:
        instr, message = found
        raise _error(text, filename, definition_position(text, instr), f"'{instr.name}' {message}")


def definition_position(text: str, instr: Instruction) -> int:
    """Offset of the name in `instr`'s defining line (instructions keep no positions), found
    within its computation; the computation's name, or 0, for instructions the text does not
    name (nested operands, `%t#1` elements)."""
    import re

    start = 0
    comp = instr.parent
    if comp is not None:
        header = re.search(rf"^[ \t]*(?:ENTRY[ \t]+)?%?{re.escape(comp.name)}[ \t]*[({{]", text, re.M)
        if header is not None:
            start = header.start() + header.group(0).index(comp.name)
    line = re.compile(rf"^[ \t]*(?:ROOT[ \t]+)?(%?{re.escape(instr.name)})[ \t]*=", re.M).search(text, start)
    return line.start(1) if line is not None else start


def _error(text: str, filename: str, pos: int, message: str) -> HloParseError:
    line, col, source = position_of(text, pos)
    return HloParseError(message, filename=filename, line=line, column=col, source_line=source)


def _lark_error(text: str, filename: str, e: lark.exceptions.UnexpectedInput) -> HloParseError:
    pos = getattr(e, "pos_in_stream", None)
    if isinstance(e, lark.exceptions.UnexpectedToken):
        tok = e.token
        pos = tok.start_pos if tok.start_pos is not None and tok.type != "$END" else len(text)
        got = "end of input" if tok.type == "$END" else repr(tok.value)
        expected = sorted({grammar.terminal_description(t) for t in e.expected})
        message = f"expected {_one_of(expected)}, got {got}"
    elif isinstance(e, lark.exceptions.UnexpectedCharacters):
        pos = e.pos_in_stream
        expected = sorted({grammar.terminal_description(t) for t in (e.allowed or ())})
        message = f"unexpected character {text[pos]!r}" + (
            f"; expected {_one_of(expected)}" if expected else "")
    elif isinstance(e, lark.exceptions.UnexpectedEOF):
        pos = len(text)
        message = "unexpected end of input"
    else:
        message = str(e)
    return _error(text, filename, pos or 0, message)


def _one_of(items: list[str]) -> str:
    if len(items) == 1:
        return items[0]
    return "one of " + ", ".join(items)
