"""How many times a `while` runs, when the module says so.

What a scan over layers executes is its body times the trip count; statistics that count the
body once understate a scanned model's communication by the number of layers.  Two sources,
as XLA's own while-loop analysis reads them:

* `backend_config={"known_trip_count":{"n":"12"}}`, which XLA's passes write once they know it;
* the counted-loop shape every `lax.scan` / `fori_loop` lowers to: the condition compares one
  integer element of the loop tuple with a constant, the body adds a constant to that element,
  and the loop starts from a tuple whose element there is a constant.

Anything else (a bound computed at run time, a counter changed elsewhere) is unknown: None.
"""

from __future__ import annotations

import json
import math

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.shape import ArrayShape


def trip_count(loop: Instruction) -> int | None:
    """The number of iterations of `loop` (a `while`), or None when it is not known."""
    known = _known_trip_count(loop)
    if known is not None:
        return known
    cond, body = loop.called.get("condition"), loop.called.get("body")
    if not isinstance(cond, Computation) or not isinstance(body, Computation) or len(loop.operands) != 1:
        return None
    init = loop.operands[0]
    compare = cond.root
    if compare is None or compare.opcode is not Opcode.COMPARE:
        return None
    direction = compare.attr("direction")
    lhs, rhs = compare.operands
    index, bound = _element_of_parameter(lhs), _int_constant(rhs)
    if index is None or bound is None:
        index, bound = _element_of_parameter(rhs), _int_constant(lhs)
        direction = {"LT": "GT", "GT": "LT", "LE": "GE", "GE": "LE"}.get(direction, direction)
    if index is None or bound is None:
        return None
    start = _int_constant(init.operands[index]) if init.opcode is Opcode.TUPLE else None
    step = _step(body.root, index)
    if start is None or step is None or step == 0:
        return None
    return _iterations(start, bound, step, direction)


def _known_trip_count(loop: Instruction) -> int | None:
    config = loop.attr("backend_config")
    if not isinstance(config, str) or "known_trip_count" not in config:
        return None
    try:
        n = json.loads(config)["known_trip_count"]["n"]
        return int(n)
    except (ValueError, KeyError, TypeError):
        return None


def _is_int_scalar(x: Instruction) -> bool:
    shape = x.shape
    return isinstance(shape, ArrayShape) and shape.rank == 0 and shape.element_type.is_integer


def _element_of_parameter(x: Instruction) -> int | None:
    """k when `x` is element k of its computation's (tuple) parameter 0."""
    if (x.opcode is Opcode.GET_TUPLE_ELEMENT and x.operands[0].opcode is Opcode.PARAMETER
            and x.operands[0].parameter_number == 0 and _is_int_scalar(x)):
        return int(x.attr("index"))
    return None


def _int_constant(x: Instruction) -> int | None:
    if x.opcode is Opcode.CONSTANT and _is_int_scalar(x):
        return int(x.literal_value())
    return None


def _step(root: Instruction | None, index: int) -> int | None:
    """The constant the body adds to element `index` of the loop tuple each iteration."""
    if root is None or root.opcode is not Opcode.TUPLE or index >= len(root.operands):
        return None
    update = root.operands[index]
    if update.opcode not in (Opcode.ADD, Opcode.SUBTRACT):
        return None
    a, b = update.operands
    if _element_of_parameter(a) == index and _int_constant(b) is not None:
        step = _int_constant(b)
    elif update.opcode is Opcode.ADD and _element_of_parameter(b) == index and _int_constant(a) is not None:
        step = _int_constant(a)
    else:
        return None
    assert step is not None
    return -step if update.opcode is Opcode.SUBTRACT else step


def _iterations(start: int, bound: int, step: int, direction: str) -> int | None:
    if direction == "LT" and step > 0:
        return max(0, math.ceil((bound - start) / step))
    if direction == "LE" and step > 0:
        return max(0, (bound - start) // step + 1)
    if direction == "GT" and step < 0:
        return max(0, math.ceil((start - bound) / -step))
    if direction == "GE" and step < 0:
        return max(0, (start - bound) // -step + 1)
    if direction == "NE" and (bound - start) % step == 0 and (bound - start) // step >= 0:
        return (bound - start) // step
    return None
