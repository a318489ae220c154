"""Which attributes each opcode takes, which it needs, and how each value must read.

XLA's parser knows, per opcode, the exact set of `key=value` attributes it
accepts; any other key ("calls" on a send, "index" on a negate, a misspelled
"dimension=") is an error there, and so it is here.  The table below lists the
keys of XLA's parser as jaxlib 0.12.0.1 has them (asked of XLA itself: each
opcode's "Allowed attributes" list), with a value kind per key and whether the
key is required.  A kind names a check of the value's text; values keep their
text and are read into typed values later by `attribute_reader`.

    ROOT r = f32[4] negate(p), dimensions={0}
    # -> error: unexpected attribute 'dimensions' for negate; it takes: backend_config, ...

This table describes the *syntax* XLA's parser accepts; the IR's typed attribute
views describe what passes read.  The two meet in `attribute_reader`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, cast

from hlo_passes.ir.opcode import Opcode
from hlo_passes.parse.limits import INT64_MAX, INT64_MIN, MAX_DEVICES, parse_int64, quote


class AttributeValueError(ValueError):
    """A value that does not read as its key requires; the message says what was expected."""


# ------------------------------------------------------------------ kinds --
_NAME = r"%?[A-Za-z_][A-Za-z0-9_.\-]*"
_STRING = r'"(?:[^"\\]|\\.)*"'
_INT = r"-?[0-9]+"
_STRING_RE = re.compile(_STRING)
_NAME_RE = re.compile(_NAME)
_INT_LIST_RE = re.compile(rf"\{{\s*(?:{_INT}\s*(?:,\s*{_INT}\s*)*)?\}}")
_FLOAT_RE = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+(?:[eE][-+]?[0-9]+)?|inf)")
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _ints_of(raw: str) -> list[int]:
    body = raw.strip()[1:-1].strip()
    return [parse_int64(x.strip()) for x in body.split(",")] if body else []


def check_bool(raw: str) -> None:
    if raw not in ("true", "false"):
        raise AttributeValueError(f"expects true or false, got {quote(raw)}")


def check_int(raw: str) -> None:
    try:
        parse_int64(raw)
    except ValueError as e:
        raise AttributeValueError(str(e)) from None


def check_int32(raw: str) -> None:
    check_int(raw)
    if not -(1 << 31) <= int(raw) < (1 << 31):
        raise AttributeValueError(f"value {quote(raw)} is out of range for int32")


def check_float(raw: str) -> None:
    if not _FLOAT_RE.fullmatch(raw):
        raise AttributeValueError(f"expects a number, got {quote(raw)}")
    if abs(float(raw)) > 3.4028234663852886e38 and raw.lstrip("-") != "inf":
        raise AttributeValueError(f"value {quote(raw)} is out of range for float")


def check_string(raw: str) -> None:
    from hlo_passes.parse.strings import unquote

    if not _STRING_RE.fullmatch(raw):
        raise AttributeValueError(f"expects a quoted string, got {quote(raw)}")
    try:
        unquote(raw)
    except ValueError as e:
        raise AttributeValueError(str(e)) from None


def check_string_or_json(raw: str) -> None:
    """backend_config: a quoted string, or a `{...}` dictionary kept as its text."""
    if raw.startswith("{"):
        return  # balanced by the grammar
    check_string(raw)


def check_int_list(raw: str) -> None:
    if not _INT_LIST_RE.fullmatch(raw):
        raise AttributeValueError(f"expects a list of integers like {{0,1}}, got {quote(raw)}")
    _ints_of(raw)


def check_int_list_list(raw: str) -> None:
    body = raw.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise AttributeValueError(f"expects a list of integer lists like {{{{0,1}},{{1,0}}}}, got {quote(raw)}")
    inner = body[1:-1].strip()
    if inner and not re.fullmatch(rf"{_INT_LIST_RE.pattern}(?:\s*,\s*{_INT_LIST_RE.pattern})*", inner):
        raise AttributeValueError(f"expects a list of integer lists like {{{{0,1}},{{1,0}}}}, got {quote(raw)}")
    for group in re.findall(_INT_LIST_RE.pattern, inner):
        _ints_of(group)


def check_pairs(raw: str) -> None:
    check_int_list_list(raw)
    for group in re.findall(_INT_LIST_RE.pattern, raw.strip()[1:-1]):
        if len(_ints_of(group)) != 2:
            raise AttributeValueError("expects 'source_target_pairs=' to be a list of pairs")


def check_computation(raw: str) -> None:
    if not _NAME_RE.fullmatch(raw):
        if raw.startswith("{"):
            raise AttributeValueError("a computation written inline ({...}) is not supported; "
                                      "define it and refer to it by name")
        raise AttributeValueError(f"expects a computation name, got {quote(raw)}")


def check_computation_list(raw: str) -> None:
    body = raw.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise AttributeValueError(f"expects a list of computation names like {{a, b}}, got {quote(raw)}")
    for name in body[1:-1].split(","):
        if body[1:-1].strip() and not _NAME_RE.fullmatch(name.strip()):
            raise AttributeValueError(f"expects a computation name, got {quote(name.strip())}")


def check_instruction_list(raw: str) -> None:
    body = raw.strip()
    if not (body.startswith("{") and body.endswith("}")) or not body[1:-1].strip():
        raise AttributeValueError(f"expects a list of instruction names like {{a, b}}, got {quote(raw)}")
    for name in body[1:-1].split(","):
        if not _NAME_RE.fullmatch(name.strip()):
            raise AttributeValueError(f"expects an instruction name, got {quote(name.strip())}")


def enum(*values: str, fold_case: bool = False) -> Callable[[str], None]:
    allowed = frozenset(v.lower() for v in values) if fold_case else frozenset(values)

    def check(raw: str) -> None:
        if (raw.lower() if fold_case else raw) not in allowed:
            raise AttributeValueError(f"expects one of {', '.join(values)}, got {quote(raw)}")

    return check


def check_identifier(raw: str) -> None:
    if not _IDENT_RE.fullmatch(raw):
        raise AttributeValueError(f"expects a word, got {quote(raw)}")


def check_balanced(raw: str) -> None:
    """Values whose inner syntax this table does not describe: the grammar balanced them."""


def _typed(key: str) -> Callable[[str], None]:
    """Checks through the typed reader of `key` (the grammar's attr_* start rules)."""

    def check(raw: str) -> None:
        from hlo_passes.parse.attribute_reader import reader_for

        try:
            cast("Callable[[str], object]", reader_for(key))(raw)  # keys with a typed reader
        except ValueError as e:
            raise AttributeValueError(str(e)) from None

    return check


def check_parameter_replication(raw: str) -> None:
    if not re.fullmatch(r"\{\s*(?:(?:true|false)\s*(?:,\s*(?:true|false)\s*)*)?\}", raw):
        raise AttributeValueError(f"expects a list like {{true,false}}, got {quote(raw)}")


def check_bool_or_bool_list(raw: str) -> None:
    if raw in ("true", "false"):
        return
    check_parameter_replication(raw)


_STATISTIC = r"[A-Za-z_][A-Za-z0-9_.\-]*=-?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)"


def check_statistics(raw: str) -> None:
    if not re.fullmatch(rf"\{{\s*(?:{_STATISTIC}(?:\s*,\s*{_STATISTIC})*)?\s*\}}", raw):
        raise AttributeValueError(f"expects statistics like {{visualizing_index=1,stat=2}}, got {quote(raw)}")


_METADATA_KINDS = {
    "op_type": "string", "op_name": "string", "source_file": "string", "deduplicated_name": "string",
    "scheduling_name": "string", "source_line": "int32", "source_end_line": "int32",
    "source_column": "int32", "source_end_column": "int32", "stack_frame_id": "int32",
    "profile_type": "int_list",
}
_METADATA_FIELD = re.compile(rf"\s*,?\s*([A-Za-z_][A-Za-z0-9_]*)=({_STRING}|{_INT}|\{{[^{{}}]*\}})")


def check_metadata(raw: str) -> None:
    """metadata={op_type="dot" op_name="..." source_line=3 ...} (fields in any order, optional
    commas), read without the grammar: big dumps carry one per instruction."""
    if not (raw.startswith("{") and raw.endswith("}")):
        raise AttributeValueError(f"expects metadata in braces, got {quote(raw)}")
    body, pos, seen = raw[1:-1], 0, set()
    while pos < len(body):
        if not body[pos:].strip():
            break
        m = _METADATA_FIELD.match(body, pos)
        if m is None:
            raise AttributeValueError(f"cannot read metadata field at {quote(body[pos:].strip())}")
        key, value = m.group(1), m.group(2)
        kind = _METADATA_KINDS.get(key)
        if kind is None:
            raise AttributeValueError(f"unknown metadata field {quote(key)}; expected one of "
                                      f"{', '.join(_METADATA_KINDS)}")
        if key in seen:
            raise AttributeValueError(f"metadata field {quote(key)} given twice")
        seen.add(key)
        if kind == "string":
            if not value.startswith('"'):
                raise AttributeValueError(f"metadata {key} expects a string, got {quote(value)}")
            check_string(value)
        if kind == "int32":
            check_int32(value) if re.fullmatch(_INT, value) else _raise(f"metadata {key} expects an integer")
        if kind == "int_list":
            check_int_list(value)
        pos = m.end()


def _raise(message: str) -> None:
    raise AttributeValueError(message)


def check_result_accuracy(raw: str) -> None:
    number = r"-?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+(?:[eE][-+]?[0-9]+)?)"
    tolerance = rf"(?:atol|rtol|ulps)={number}"
    mode = r"mode=(?:default|highest|DEFAULT|HIGHEST)"
    if not re.fullmatch(rf"\{{\s*(?:{mode}|tolerance=\{{\s*(?:{tolerance}(?:\s*,\s*{tolerance})*)?\s*\}})\s*\}}", raw):
        raise AttributeValueError("expects {mode=default|highest} or {tolerance={atol=..,rtol=..,ulps=..}}, "
                                  f"got {quote(raw)}")


_SHAPE_INDEX = r"\{\s*(?:[0-9]+\s*(?:,\s*[0-9]+\s*)*)?\}"


def check_instruction_aliasing(raw: str) -> None:
    """output_to_operand_aliasing={{0}: (1, {}), {1}: (0, {0})}"""
    _typed("output_to_operand_aliasing")(raw)


# A module's input_output_alias={ {0}: (0, {}, may-alias) } and buffer_donor={ (0, {}) }.
ALIAS_ENTRY = re.compile(rf"({_SHAPE_INDEX})\s*:\s*\(\s*({_INT})\s*,\s*({_SHAPE_INDEX})\s*(?:,\s*([a-z\-]+)\s*)?\)")
DONOR_ENTRY = re.compile(rf"\(\s*({_INT})\s*,\s*({_SHAPE_INDEX})\s*\)")


def _entries(raw: str, entry: re.Pattern[str], what: str) -> list[re.Match[str]]:
    body = raw.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise AttributeValueError(f"expects '{{' at the start of the {what} description")
    inner, pos, found = body[1:-1], 0, []
    while inner[pos:].strip():
        m = entry.match(inner, len(inner) - len(inner[pos:].lstrip()))
        if m is None:
            raise AttributeValueError(f"cannot read the {what} entry at {quote(inner[pos:].strip())}")
        found.append(m)
        rest = inner[m.end():].lstrip()
        if rest and not rest.startswith(","):
            raise AttributeValueError(f"expects ',' or '}}' after a {what} entry, got {quote(rest)}")
        pos = len(inner) - len(rest) + (1 if rest else 0)
    return found


def check_aliasing(raw: str) -> None:
    for m in _entries(raw, ALIAS_ENTRY, "aliasing"):
        if m.group(4) not in (None, "may-alias", "must-alias"):
            raise AttributeValueError(f"unexpected aliasing kind {quote(m.group(4))}; expected may-alias or "
                                      "must-alias")


def check_buffer_donor(raw: str) -> None:
    _entries(raw, DONOR_ENTRY, "buffer donor")


def check_domain(raw: str) -> None:
    m = re.fullmatch(rf"\{{\s*,?\s*kind=({_STRING})\s*,?\s*entry=(\{{.*\}})\s*,?\s*exit=(\{{.*\}})\s*\}}", raw, re.S)
    if m is None:
        raise AttributeValueError(f"expects {{kind=\"sharding\", entry={{...}}, exit={{...}}}}, got {quote(raw)}")
    from hlo_passes.parse.strings import unquote

    if unquote(m.group(1)) != "sharding":
        raise AttributeValueError(f"unsupported domain kind: {quote(unquote(m.group(1)))}")
    for part in (m.group(2), m.group(3)):
        _typed("sharding")(part)


def check_shape(raw: str) -> None:
    from hlo_passes.parse.shapes import parse_shape

    try:
        parse_shape(raw)
    except Exception:  # noqa: BLE001 - any reading failure is a bad value
        raise AttributeValueError(f"expects a shape, got {quote(raw)}") from None


def check_shape_list(raw: str) -> None:
    from hlo_passes.parse import grammar

    try:
        grammar.compiled().parse(raw, start="attr_shape_list")
    except Exception:  # noqa: BLE001
        raise AttributeValueError(f"expects a list of shapes like {{f32[2]{{0}}, s32[]}}, got {quote(raw)}") from None


def check_literal(raw: str) -> None:
    """custom-call literal=s32[2]{0} {1, 2} or a tuple of them: a shape, then its literal."""
    from hlo_passes.parse import literal_check

    literal_check.check_shaped_literal(raw)


def check_computation_layout(raw: str) -> None:
    """{(f32[8]{0}, s32[])->f32[8]{0}}: each shape read once through the shared shape cache."""
    from hlo_passes.parse.shapes import parse_shape

    m = re.fullmatch(r"\{\s*\((.*)\)\s*->\s*(.*?)\s*\}", raw, re.S)
    if m is None:
        raise AttributeValueError(f"expects {{(parameter shapes)->result shape}}, got {quote(raw)}")
    parts = [p for p in split_top_level(m.group(1)) if p.strip()] + [m.group(2)]
    for part in parts:
        try:
            parse_shape(strip_index_comments(part.strip()))
        except Exception:  # noqa: BLE001 - any reading failure is a bad value
            raise AttributeValueError(f"expects a shape, got {quote(part.strip())}") from None


def strip_index_comments(text: str) -> str:
    return re.sub(r"/\*.*?\*/", "", text) if "/*" in text else text


def split_top_level(text: str) -> list[str]:
    """`text` split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def check_window(raw: str) -> None:
    """XLA's window syntax: sub-attributes size= (required), stride=, pad=low_high, lhs_dilate=,
    rhs_dilate=, rhs_reversal=, each once, each with one entry per window dimension."""
    if not (raw.startswith("{") and raw.endswith("}")):
        raise AttributeValueError(f"expects a window like {{size=3 stride=2}}, got {quote(raw)}")
    fields: dict[str, list[str]] = {}
    for part in raw[1:-1].split():
        key, eq, value = part.partition("=")
        if not eq:
            raise AttributeValueError(f"expects sub-attributes in window, got {quote(part)}")
        if key not in ("size", "stride", "pad", "lhs_dilate", "rhs_dilate", "rhs_reversal"):
            raise AttributeValueError(f"unexpected window sub-attribute {quote(key)}")
        if key in fields:
            raise AttributeValueError(f"sub-attribute '{key}=' already exists")
        items = value.split("x")
        for item in items:
            numbers = item.split("_")
            if key == "pad" and len(numbers) != 2:
                raise AttributeValueError("expects padding_low and padding_high separated by '_'")
            if key != "pad" and len(numbers) != 1:
                raise AttributeValueError(f"expects sub-attribute '{key}=ixj...', got {quote(value)}")
            for number in numbers:
                check_int(number)
        fields[key] = items
    if fields and "size" not in fields:
        raise AttributeValueError("window needs size=")
    n = len(fields.get("size", ()))
    for key, items in fields.items():
        if len(items) != n:
            raise AttributeValueError(f"expects '{key}=' has the same size as 'size='")


def check_dim_labels(raw: str) -> None:
    """b01f_01io->b01f: letters unique per part, digits in range, as many spatial digits in all
    three parts (XLA's ParseConvolutionDimensionNumbers)."""
    m = re.fullmatch(r"([0-9a-z?]+)_([0-9a-z?]+)->([0-9a-z?]+)", raw)
    if m is None:
        raise AttributeValueError(f"expects dim labels pattern, e.g., 'bf0_0io->0bf', got {quote(raw)}")
    spatial = []
    for part, letters in zip(m.groups(), ("bf", "io", "bf")):
        chars = [c for c in part if c != "?"]
        if len(set(chars)) != len(chars):
            raise AttributeValueError(f"expects unique dimension labels, but sees {part}")
        for c in chars:
            if c not in letters and not ("0" <= c < chr(ord("0") + len(part))):
                raise AttributeValueError(f"expects [0-{len(part) - 1}{letters}?] in {quote(part)}")
        for c in letters:
            if c not in part:
                raise AttributeValueError(f"dimension labels {quote(part)} need a {c!r}")
        digits = sorted(c for c in chars if c.isdigit())
        if digits != [str(i) for i in range(len(digits))]:
            raise AttributeValueError(f"spatial dimensions of {quote(part)} must be numbered from 0")
        spatial.append(len(digits))
    if len(set(spatial)) != 1:
        raise AttributeValueError("input, kernel, and output must have same number of spatial dimensions, "
                                  f"but got {spatial[0]}, {spatial[1]}, {spatial[2]}, respectively")


def check_padding(raw: str) -> None:
    for part in raw.split("x"):
        numbers = part.split("_")
        if len(numbers) not in (2, 3):
            raise AttributeValueError("expects padding config pattern like 'low_high_interior' or 'low_high'")
        for n in numbers:
            check_int(n)


def check_sharding(raw: str) -> None:
    _typed("sharding")(raw)


def check_replica_groups(raw: str) -> None:
    _typed("replica_groups")(raw)


def check_slice(raw: str) -> None:
    _typed("slice")(raw)


def check_frontend_attributes(raw: str) -> None:
    _typed("frontend_attributes")(raw)


def check_original_value(raw: str) -> None:
    if not raw.startswith("{"):
        raise AttributeValueError(f"expects an original value in braces, got {quote(raw)}")


PRECISIONS = enum("default", "high", "highest", fold_case=True)
ALGORITHMS = enum(
    "unset", "dot_any_f8_any_f8_f32", "dot_any_f8_any_f8_f32_fast_accum", "dot_any_f8_any_f8_any",
    "dot_any_f8_any_f8_any_fast_accum", "dot_f16_f16_f16", "dot_f16_f16_f32", "dot_bf16_bf16_bf16",
    "dot_bf16_bf16_f32", "dot_bf16_bf16_f32_x3", "dot_bf16_bf16_f32_x6", "dot_bf16_bf16_f32_x9",
    "dot_tf32_tf32_f32", "dot_tf32_tf32_f32_x3", "dot_f32_f32_f32", "dot_f64_f64_f64", fold_case=True)


def check_precision_list(raw: str) -> None:
    body = raw.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise AttributeValueError(f"expects a list like {{default,high}}, got {quote(raw)}")
    for item in body[1:-1].split(","):
        if body[1:-1].strip():
            PRECISIONS(item.strip())


# ------------------------------------------------------------------ table --
@dataclass(frozen=True)
class Spec:
    """One key an opcode takes: how its value reads and whether it must be given."""

    check: Callable[[str], None]
    required: bool = False


def req(check: Callable[[str], None]) -> Spec:
    return Spec(check, True)


def opt(check: Callable[[str], None]) -> Spec:
    return Spec(check, False)


# Keys every instruction takes (XLA's ParseInstructionRhs).
COMMON: dict[str, Spec] = {
    "sharding": opt(check_sharding), "frontend_attributes": opt(check_frontend_attributes),
    "statistics": opt(check_statistics), "parameter_replication": opt(check_parameter_replication),
    "control-predecessors": opt(check_instruction_list), "origin": opt(check_original_value),
    "metadata": opt(check_metadata), "backend_config": opt(check_string_or_json),
}

_ACCURACY = {"result_accuracy": opt(check_result_accuracy)}
_GROUPS = {"replica_groups": opt(check_replica_groups), "channel_id": opt(check_int)}
_COLLECTIVE_MODE = opt(check_identifier)
_DOT_DIMS = {k: opt(check_int_list) for k in ("lhs_contracting_dims", "rhs_contracting_dims",
                                                "lhs_batch_dims", "rhs_batch_dims")}
_CONVOLUTION_LIKE = {"window": opt(check_window), "feature_group_count": opt(check_int),
                     "batch_group_count": opt(check_int), "operand_precision": opt(check_precision_list)}
_SEND_RECV = {"channel_id": opt(check_int), "is_host_transfer": opt(check_bool)}
_ALL_GATHER = {**_GROUPS, "dimensions": req(check_int_list), "constrain_layout": opt(check_bool),
               "use_global_device_ids": opt(check_bool)}
_ALL_REDUCE = {**_GROUPS, "to_apply": req(check_computation), "constrain_layout": opt(check_bool),
               "use_global_device_ids": opt(check_bool), "mode": _COLLECTIVE_MODE}
_COLLECTIVE_PERMUTE = {"source_target_pairs": req(check_pairs), "channel_id": opt(check_int),
                       "slice_sizes": opt(check_int_list_list)}
_UNARY_WITH_ACCURACY = (
    Opcode.ACOS, Opcode.ACOSH, Opcode.ASIN, Opcode.ASINH, Opcode.ATANH, Opcode.EXPM1, Opcode.LOG, Opcode.LOG1P,
    Opcode.LOGISTIC, Opcode.SQRT, Opcode.CBRT, Opcode.RSQRT, Opcode.TANH, Opcode.ERF, Opcode.SIN, Opcode.SINH,
    Opcode.COS, Opcode.COSH, Opcode.TAN, Opcode.EXP,
)
_CALL_KEYS = {
    Opcode.ALL_GATHER: _ALL_GATHER, Opcode.ALL_GATHER_START: _ALL_GATHER,
    Opcode.ALL_REDUCE: _ALL_REDUCE, Opcode.ALL_REDUCE_START: _ALL_REDUCE,
    Opcode.REDUCE_SCATTER: {**_ALL_REDUCE, "dimensions": req(check_int_list)},
    Opcode.COLLECTIVE_REDUCE: {**_GROUPS, "to_apply": req(check_computation), "constrain_layout": opt(check_bool),
                               "use_global_device_ids": opt(check_bool), "has_dynamic_root": opt(check_bool)},
    Opcode.ALL_TO_ALL: {**_GROUPS, "dimensions": opt(check_int_list), "constrain_layout": opt(check_bool)},
    Opcode.RAGGED_ALL_TO_ALL: {**_GROUPS, "dimensions": opt(check_int_list)},
    Opcode.COLLECTIVE_BROADCAST: {**_GROUPS, "has_dynamic_root": opt(check_bool)},
    Opcode.COLLECTIVE_PERMUTE: _COLLECTIVE_PERMUTE, Opcode.COLLECTIVE_PERMUTE_START: _COLLECTIVE_PERMUTE,
    Opcode.IOTA: {"iota_dimension": req(check_int)},
    Opcode.TOPK: {"k": req(check_int), "largest": opt(check_bool), "is_stable": opt(check_bool)},
    Opcode.COPY_START: {"cross_program_prefetch_index": opt(check_int32)},
    Opcode.RESHAPE: {"inferred_dimension": opt(check_int)},
    Opcode.SORT: {"dimensions": req(check_int_list), "is_stable": opt(check_bool), "to_apply": req(check_computation)},
    Opcode.WHILE: {"condition": req(check_computation), "body": req(check_computation)},
    Opcode.RECV: _SEND_RECV, Opcode.RECV_DONE: _SEND_RECV, Opcode.SEND: _SEND_RECV, Opcode.SEND_DONE: _SEND_RECV,
    Opcode.GET_TUPLE_ELEMENT: {"index": req(check_int)},
    Opcode.CALL: {"to_apply": req(check_computation), "is_composite": opt(check_bool)},
    Opcode.REDUCE_WINDOW: {"window": opt(check_window), "to_apply": req(check_computation)},
    Opcode.CONVOLUTION: {**_CONVOLUTION_LIKE, "dim_labels": req(check_dim_labels), "algorithm": opt(ALGORITHMS),
                         "convolution_kind": opt(check_identifier), "sparsity_config": opt(check_balanced),
                         "block_scaling_config": opt(check_balanced)},
    Opcode.FFT: {"fft_type": req(enum("FFT", "IFFT", "RFFT", "IRFFT")), "fft_length": req(check_int_list)},
    Opcode.TRIANGULAR_SOLVE: {"left_side": opt(check_bool), "lower": opt(check_bool),
                              "unit_diagonal": opt(check_bool),
                              "transpose_a": opt(enum("NO_TRANSPOSE", "TRANSPOSE", "ADJOINT", "TRANSPOSE_INVALID"))},
    Opcode.COMPARE: {"direction": req(enum("EQ", "NE", "GE", "GT", "LE", "LT")),
                     "type": opt(enum("FLOAT", "TOTALORDER", "SIGNED", "UNSIGNED")),
                     "order": opt(check_identifier)},
    Opcode.CHOLESKY: {"lower": opt(check_bool)},
    Opcode.BROADCAST: {"dimensions": opt(check_int_list)},  # required unless the operand is a scalar
    Opcode.CONCATENATE: {"dimensions": req(check_int_list)},
    Opcode.MAP: {"to_apply": req(check_computation), "dimensions": opt(check_int_list)},
    Opcode.SCAN: {"to_apply": req(check_computation), "dimensions": req(check_int_list),
                  "num_carries": req(check_int), "is_reverse": opt(check_bool), "is_associative": opt(check_bool)},
    Opcode.REDUCE: {"to_apply": req(check_computation), "dimensions": req(check_int_list)},
    Opcode.REVERSE: {"dimensions": req(check_int_list)},
    Opcode.SELECT_AND_SCATTER: {"select": req(check_computation), "scatter": req(check_computation),
                                "window": opt(check_window)},
    Opcode.SLICE: {"slice": req(check_slice)},
    Opcode.DYNAMIC_SLICE: {"dynamic_slice_sizes": req(check_int_list)},
    Opcode.TRANSPOSE: {"dimensions": req(check_int_list)},
    Opcode.BATCH_NORM_TRAINING: {"epsilon": req(check_float), "feature_index": req(check_int)},
    Opcode.BATCH_NORM_INFERENCE: {"epsilon": req(check_float), "feature_index": req(check_int)},
    Opcode.BATCH_NORM_GRAD: {"epsilon": req(check_float), "feature_index": req(check_int)},
    Opcode.PAD: {"padding": req(check_padding)},
    Opcode.FUSION: {"calls": req(check_computation), "kind": req(enum("kLoop", "kInput", "kOutput", "kCustom")),
                    "output_to_operand_aliasing": opt(check_instruction_aliasing)},
    Opcode.INFEED: {"infeed_config": opt(check_string)},
    Opcode.OUTFEED: {"outfeed_config": opt(check_string), "outfeed_shape": opt(check_shape)},
    Opcode.RNG: {"distribution": req(enum("rng_uniform", "rng_normal", fold_case=True))},
    Opcode.RNG_GET_AND_UPDATE_STATE: {"delta": req(check_int)},
    Opcode.RNG_BIT_GENERATOR: {"algorithm": req(enum("rng_default", "rng_three_fry", "rng_philox",
                                                     fold_case=True))},
    Opcode.REDUCE_PRECISION: {"exponent_bits": req(check_int), "mantissa_bits": req(check_int)},
    Opcode.CUSTOM_CALL: {
        **_CONVOLUTION_LIKE, "custom_call_target": req(check_string), "dim_labels": opt(check_dim_labels),
        "operand_layout_constraints": opt(check_shape_list), "custom_call_has_side_effect": opt(check_bool),
        "to_apply": opt(check_computation), "called_computations": opt(check_computation_list),
        "output_to_operand_aliasing": opt(check_instruction_aliasing),
        "padding_type": opt(enum("PADDING_INVALID", "PADDING_VALID", "PADDING_SAME")),
        "literal": opt(check_literal),
        "schedule": opt(enum("SCHEDULE_NONE", "SCHEDULE_LATEST", "SCHEDULE_EARLIEST")),
        "api_version": opt(enum("API_VERSION_ORIGINAL", "API_VERSION_STATUS_RETURNING",
                                "API_VERSION_STATUS_RETURNING_UNIFIED", "API_VERSION_TYPED_FFI")),
    },
    Opcode.DOT: {**_DOT_DIMS, "operand_precision": opt(check_precision_list), "algorithm": opt(ALGORITHMS),
                 "sparsity_config": opt(check_balanced), "block_scaling_config": opt(check_balanced)},
    Opcode.RAGGED_DOT: {**_DOT_DIMS, "operand_precision": opt(check_precision_list),
                        "lhs_ragged_dims": opt(check_int_list), "rhs_group_dims": opt(check_int_list)},
    Opcode.SCALED_DOT: {**_DOT_DIMS, "operand_precision": opt(check_precision_list), "algorithm": opt(ALGORITHMS)},
    Opcode.GATHER: {"offset_dims": req(check_int_list), "collapsed_slice_dims": req(check_int_list),
                    "start_index_map": req(check_int_list), "index_vector_dim": req(check_int),
                    "slice_sizes": req(check_int_list), "indices_are_sorted": opt(check_bool),
                    "operand_batching_dims": opt(check_int_list), "start_indices_batching_dims": opt(check_int_list)},
    Opcode.SCATTER: {"update_window_dims": req(check_int_list), "inserted_window_dims": req(check_int_list),
                     "scatter_dims_to_operand_dims": req(check_int_list), "index_vector_dim": req(check_int),
                     "to_apply": req(check_computation), "indices_are_sorted": opt(check_bool),
                     "unique_indices": opt(check_bool), "input_batching_dims": opt(check_int_list),
                     "scatter_indices_batching_dims": opt(check_int_list)},
    Opcode.DOMAIN: {"domain": req(check_domain)},
    Opcode.GET_DIMENSION_SIZE: {"dimensions": req(check_int_list)},
    Opcode.SET_DIMENSION_SIZE: {"dimensions": req(check_int_list)},
    Opcode.SHUFFLE: {"dimensions": req(check_int_list), "shifts": opt(check_int_list), "mode": opt(check_identifier)},
    Opcode.ASYNC_START: {"calls": req(check_computation), "async_execution_thread": opt(check_string),
                         "output_to_operand_aliasing": opt(check_instruction_aliasing)},
    Opcode.ASYNC_UPDATE: {"calls": opt(check_computation), "async_execution_thread": opt(check_string),
                          "output_to_operand_aliasing": opt(check_instruction_aliasing)},
    Opcode.ASYNC_DONE: {"calls": opt(check_computation), "async_execution_thread": opt(check_string)},
}
for _op in _UNARY_WITH_ACCURACY:
    _CALL_KEYS[_op] = _ACCURACY

# The keys of an instruction with opcode `op` (without the keys every instruction takes).
OPCODE_KEYS: dict[Opcode, dict[str, Spec]] = {op: _CALL_KEYS.get(op, {}) for op in Opcode}

# `op-start(...)` sugar: the wrapped op's keys, plus these (XLA's parser, async-start with a
# wrapped opcode); `op-update` and `op-done` take only the thread.
ASYNC_SUGAR_START = {"async_execution_thread": opt(check_string),
                     "output_to_operand_aliasing": opt(check_instruction_aliasing)}
ASYNC_SUGAR_OTHER = {"async_execution_thread": opt(check_string)}

# The keys of a conditional depend on its selector: pred takes the two named branches.
CONDITIONAL_PRED = {"true_computation": req(check_computation), "false_computation": req(check_computation)}
CONDITIONAL_INDEX = {"branch_computations": req(check_computation_list)}

MODULE_KEYS: dict[str, Spec] = {
    "is_scheduled": opt(check_bool), "replica_count": opt(check_int), "num_partitions": opt(check_int),
    "input_output_alias": opt(check_aliasing), "buffer_donor": opt(check_buffer_donor),
    "alias_passthrough_params": opt(check_bool), "entry_computation_layout": opt(check_computation_layout),
    "frontend_attributes": opt(check_frontend_attributes),
    "allow_spmd_sharding_propagation_to_parameters": opt(check_bool_or_bool_list),
    "allow_spmd_sharding_propagation_to_output": opt(check_bool_or_bool_list),
    "origin_recovery_table": opt(check_balanced), "backend_config": opt(check_string_or_json),
    "debug_attributes": opt(check_balanced),
}
COMPUTATION_KEYS: dict[str, Spec] = {"execution_thread": opt(check_string), "backend_config": opt(check_string_or_json)}


def device_count_problem(count: int) -> str | None:
    if count > MAX_DEVICES:
        return f"names {count:,} devices; hlo-passes reads at most {MAX_DEVICES:,} (MAX_DEVICES)"
    return None


__all__ = ["ALIAS_ENTRY", "ASYNC_SUGAR_OTHER", "ASYNC_SUGAR_START", "COMMON", "COMPUTATION_KEYS",
           "CONDITIONAL_INDEX", "CONDITIONAL_PRED", "DONOR_ENTRY", "INT64_MAX", "INT64_MIN", "MODULE_KEYS",
           "OPCODE_KEYS", "AttributeValueError", "Spec", "device_count_problem"]
