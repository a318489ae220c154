"""A module as the data the view page draws (plain JSON values, deterministic).

    data = module_data(module, source="dump/module_0012.jit_step.txt")

The layout is column-wise per computation (one list per field, instruction i at index i of each,
in post order) with repeated texts interned in module-wide tables, so that a 25k-instruction
training step is a few MB of JSON that the browser parses in tens of milliseconds:

    {"module": {name, source, kind, evidence, devices, mesh},
     "summary": {instructions, opcodes: [[opcode, count]], collectives: [{kind, count, bytes}],
                 flops, parameter_bytes: [bytes on device d], peak_parameter_bytes},
     "opcodes": [...], "shapes": [...], "strings": [...],
     "shardings": [sharding_data records], "sources": [{file, line, stack: [[file, line, function]]}],
     "computations": [{name, kind, entry, root, callers: [[comp, instr]],
                       names: [...], opcode: [...], shape: [...], operands: [[...]], group: [...],
                       sharding: [...], tile: [...], source: [...], op_name: [...], text: [...],
                       calls: {instr: [comp, ...]},
                       groups: [{label, parent, kind, scope, children, members}]}],
     "collectives": [{comp, instr, kind, bytes, groups, pairs}]}

Indices into the tables are -1 where an instruction has none.  The summary comes from
`hlo_passes.stats.module_stats`, the same numbers `--stats` prints.
"""

from __future__ import annotations

from typing import Any

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.program_kind import ProgramKind, read_program
from hlo_passes.parse.attribute_reader import reader_for
from hlo_passes.printer import print_instruction
from hlo_passes.stats import collective_bytes, collective_kind, module_stats
from hlo_passes.view.scopes import group_instructions
from hlo_passes.view.sharding_data import (bytes_on_device, mesh_shape, replica_groups_data, sharding_data,
                                           tile_shape_text)

# How a computation is called decides what the page calls it and whether its ops are grouped.
_HELPER_KEYS = frozenset({"to_apply", "comparator", "select", "scatter"})
_KIND_BY_KEY = {"condition": "while condition", "body": "while body", "branch_computations": "branch",
                "true_computation": "branch", "false_computation": "branch", "comparator": "comparator",
                "select": "select", "scatter": "scatter"}


class _Interner:
    def __init__(self) -> None:
        self.items: list = []
        self.index: dict = {}

    def __call__(self, value) -> int:
        if value is None:
            return -1
        found = self.index.get(value)
        if found is None:
            found = self.index[value] = len(self.items)
            self.items.append(value)
        return found


def module_data(module: Module, source: str = "") -> dict[str, Any]:
    """Everything the view page shows about `module` (see the module docstring)."""
    reading = read_program(module)
    stats = module_stats(module)
    num_devices = max(1, reading.num_devices)
    opcodes, shapes, strings = _Interner(), _Interner(), _Interner()
    sharding_table: dict[str, int] = {}
    sharding_records: list[dict] = []
    sources = _SourceTable(module)
    comp_index = {id(c): k for k, c in enumerate(module.computations)}
    callers: dict[int, list[tuple[int, int, str, Opcode]]] = {}
    orders = [c.post_order() for c in module.computations]
    positions = [{instr: k for k, instr in enumerate(order)} for order in orders]
    for ci, order in enumerate(orders):
        for ii, instr in enumerate(order):
            for key, value in instr.called.items():
                for callee in value if isinstance(value, tuple) else (value,):
                    callers.setdefault(id(callee), []).append((ci, ii, key, instr.opcode))
    collectives: list[dict] = []
    unreadable: dict[str, list] = {}  # attribute key -> [count, first example]
    comps = []
    for ci, (comp, order) in enumerate(zip(module.computations, orders)):
        pos = positions[ci]
        kind = _computation_kind(comp, callers.get(id(comp), []))
        col: dict[str, list] = {k: [] for k in ("names", "opcode", "shape", "operands", "sharding", "tile",
                                                  "source", "op_name", "text")}
        calls: dict[str, list[int]] = {}
        op_names: list[str | None] = []
        for ii, instr in enumerate(order):
            meta = _read(instr, "metadata", unreadable)
            sharding = _read(instr, "sharding", unreadable)
            op_name = meta.op_name if meta is not None else None
            op_names.append(op_name)
            col["names"].append(instr.name)
            col["opcode"].append(opcodes(instr.opcode.value))
            col["shape"].append(shapes(instr.shape.to_hlo(False)))
            col["operands"].append([pos[o] for o in instr.operands if o in pos])
            col["sharding"].append(sharding_data(sharding, sharding_table, sharding_records)
                                   if sharding is not None else -1)
            col["tile"].append(shapes(tile_shape_text(instr.shape, sharding))
                               if reading.kind is ProgramKind.GLOBAL else -1)
            col["source"].append(sources.index(instr, meta))
            col["op_name"].append(strings(op_name))
            col["text"].append(print_instruction(instr).strip())
            called = instr.called_computations()
            if called:
                calls[str(ii)] = [comp_index[id(c)] for c in called if id(c) in comp_index]
            ckind = collective_kind(instr)
            if ckind is not None:
                collectives.append(_collective(ci, ii, instr, ckind, num_devices, unreadable))
        tree = group_instructions(op_names, [instr.opcode.value for instr in order],
                                  [instr.opcode is Opcode.PARAMETER for instr in order], col["operands"],
                                  by_scope=kind in ("entry", "while body", "while condition", "branch", "call"))
        comps.append({
            "name": comp.name, "kind": kind, "entry": comp is module.entry,
            "root": pos.get(comp.root, -1) if comp.root is not None else -1,
            "callers": [[c, i] for c, i, _, _ in callers.get(id(comp), [])],
            **col, "group": tree.group_of, "calls": calls,
            "groups": [{"label": g.label, "parent": g.parent, "kind": g.kind, "scope": g.scope,
                        "children": g.children, "members": g.members} for g in tree.groups],
        })
    # The entry first: it is what the page opens on.
    summary = {
        "instructions": stats.instructions,
        "opcodes": sorted(([op, n] for op, n in stats.opcodes.items()), key=lambda x: (-x[1], x[0])),
        "collectives": [{"kind": k, "count": stats.collective_count[k], "bytes": stats.collective_bytes[k]}
                        for k in sorted(stats.collective_count)],
        "flops": stats.flops,
        **_parameter_bytes(module, reading.kind, num_devices),
    }
    return {
        "module": {"name": module.name, "source": source, "kind": reading.kind.value,
                   "evidence": reading.evidence, "devices": num_devices, "mesh": mesh_shape(num_devices)},
        "summary": summary,
        "opcodes": opcodes.items, "shapes": shapes.items, "strings": strings.items,
        "shardings": sharding_records, "sources": sources.records,
        "computations": comps,
        "collectives": collectives,
        "unreadable": unreadable,
    }


def _read(instr: Instruction, key: str, unreadable: dict[str, list] | None = None):
    """`instr.attr(key)`, or None when our attribute reader rejects its text: the view still
    shows the instruction (its printed line has the text) and lists what it could not read."""
    try:
        return instr.attr(key)
    except Exception as e:  # any reader error: the page must still open
        if key == "metadata":
            value = _metadata_with_c_escapes(instr)
            if value is not None:
                return value
        if unreadable is not None:
            seen = unreadable.setdefault(key, [0, f"{instr.name}: {e}"])
            seen[0] += 1
        return None


def _metadata_with_c_escapes(instr: Instruction):
    """XLA writes strings with C escapes (`op_name="params[\\'w\\']"` for a pytree path); the
    attribute reader decodes them as JSON, which has no `\\'`.  Until it reads C escapes, the
    view reads such metadata with `\\'` taken as `'` (the only C escape JSON lacks that JAX
    writes in op names)."""
    slot = instr.attributes.get("metadata")
    if slot is None or slot.raw is None or "\\'" not in slot.raw:
        return None
    try:
        return reader_for("metadata")(slot.raw.replace("\\'", "'"))
    except Exception:  # still unreadable: reported as such
        return None


def _computation_kind(comp: Computation, callers: list[tuple[int, int, str, Opcode]]) -> str:
    if comp.is_entry:
        return "entry"
    if not callers:
        return "uncalled"
    _, _, key, opcode = callers[0]
    if opcode is Opcode.FUSION:
        return "fusion"
    if key in _KIND_BY_KEY:
        return _KIND_BY_KEY[key]
    if opcode is Opcode.CALL:
        return "call"
    if opcode in (Opcode.ASYNC_START, Opcode.ASYNC_UPDATE, Opcode.ASYNC_DONE):
        return "async"
    if key in _HELPER_KEYS:
        return "reducer"
    return opcode.value


def _collective(ci: int, ii: int, instr: Instruction, kind: str, num_devices: int, unreadable) -> dict:
    record: dict[str, Any] = {"comp": ci, "instr": ii, "kind": kind, "bytes": collective_bytes(instr)}
    if instr.opcode in (Opcode.COLLECTIVE_PERMUTE, Opcode.COLLECTIVE_PERMUTE_START):
        pairs = _read(instr, "source_target_pairs", unreadable) or ()
        record["pairs"] = [[int(a), int(b)] for a, b in pairs]
    else:
        record["groups"] = replica_groups_data(_read(instr, "replica_groups", unreadable), num_devices)
    return record


def _parameter_bytes(module: Module, kind: ProgramKind, num_devices: int) -> dict:
    """Bytes of ENTRY parameters each device holds: the per-device shapes of a partitioned
    program, the shards of a global one (by each parameter's sharding)."""
    params = module.entry.parameters if module.entry is not None else []
    per_device = []
    for d in range(num_devices):
        total = 0
        for p in params:
            if p is None:
                continue
            sharding = None if kind.is_per_device else _read(p, "sharding")
            total += bytes_on_device(p.shape, sharding, d)
        per_device.append(total)
    peak = max(per_device) if per_device else 0
    return {"parameter_bytes": per_device, "peak_parameter_bytes": peak}


class _SourceTable:
    """`file:line` of each instruction, with the whole Python stack where the module has the
    StackFrames tables (innermost frame first)."""

    def __init__(self, module: Module):
        self.tables = module.tables
        self.records: list[dict] = []
        self._index: dict = {}

    def index(self, instr: Instruction, meta) -> int:
        if meta is None:
            return -1
        key: tuple
        if meta.source_file:
            key = ("file", meta.source_file, meta.source_line or 0)
        elif meta.stack_frame_id is not None:
            key = ("frame", meta.stack_frame_id)
        else:
            return -1
        found = self._index.get(key)
        if found is not None:
            return found
        if key[0] == "file":
            stack = [[key[1], key[2], ""]]
        else:
            stack = self._stack(key[1])
            if not stack:
                self._index[key] = -1
                return -1
        self._index[key] = len(self.records)
        self.records.append({"file": stack[0][0], "line": stack[0][1], "stack": stack})
        return self._index[key]

    def _stack(self, frame_id: int) -> list[list]:
        """Frames from `frame_id` outwards.  XLA prints a frame's `parent_frame_id` one above
        its parent's id (1: no parent): read so, the chains of JAX 0.12 dumps are the Python
        stacks of the model (checked on benchmarks/gpt_dump.py's dump)."""
        t = self.tables
        stack, seen = [], set()
        while frame_id in t.stack_frames and frame_id not in seen:
            seen.add(frame_id)
            frame = t.stack_frames[frame_id]
            loc = t.file_locations.get(frame.get("file_location_id", -1))
            if loc is not None:
                stack.append([t.file_names.get(loc.get("file_name_id", -1), "?"), loc.get("line", 0),
                              t.function_names.get(loc.get("function_name_id", -1), "")])
            parent = frame.get("parent_frame_id", 0) - 1
            if parent < 1:
                break
            frame_id = parent
        return stack
