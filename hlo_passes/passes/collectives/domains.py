"""Domains of a computation, as XLA's HloDomainMap reads them, for the combiners' keys.

A `domain` instruction marks where data crosses between two regions of a program that
carry different metadata (for `kind="sharding"`, the device a region runs on):

    d = f32[4] domain(p), domain={kind="sharding", entry={maximal device=1}, exit={maximal device=0}}

`entry=` is the metadata on the user side (the region `d` enters), `exit=` the one on the
operand side (the region the data leaves).  A domain is a connected set of instructions
reached through operands and users without crossing a `domain` instruction.  Its metadata is
the `entry=` of a domain instruction that feeds it, else the `exit=` of one it feeds, else
none.  Domains whose metadata match share one id (0 for no metadata): two all-reduces in two
separate regions that both run on device 0 may be combined, two on different devices may
not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.attributes import reader_for


@dataclass(frozen=True)
class DomainMetadata:
    """One side of a domain instruction: its kind and the metadata value (a Sharding for
    kind="sharding", else the metadata's text)."""

    kind: str
    value: Hashable


def split_fields(body: str) -> dict[str, str]:
    """`kind="sharding", entry={...}, exit={...}` -> {"kind": '"sharding"', "entry": "{...}", ...},
    splitting at top-level commas only (braces and quotes nest)."""
    fields: dict[str, str] = {}
    depth, quoted, start = 0, False, 0
    parts = []
    for i, ch in enumerate(body):
        if ch == '"' and (i == 0 or body[i - 1] != "\\"):
            quoted = not quoted
        elif not quoted and ch in "{[(":
            depth += 1
        elif not quoted and ch in "}])":
            depth -= 1
        elif not quoted and depth == 0 and ch == ",":
            parts.append(body[start:i])
            start = i + 1
    parts.append(body[start:])
    for part in parts:
        key, eq, value = part.partition("=")
        if eq:
            fields[key.strip()] = value.strip()
    return fields


def domain_sides(instr: Instruction) -> tuple[DomainMetadata, DomainMetadata] | None:
    """(user side, operand side) of a domain instruction: its `entry=` and `exit=`."""
    slot = instr.attributes.get("domain")
    if slot is None:
        return None
    text = slot.text("domain").strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    fields = split_fields(text)
    kind = fields.get("kind", "").strip('"')

    def side(raw: str) -> DomainMetadata:
        if kind == "sharding" and raw:
            try:
                return DomainMetadata(kind, reader_for("sharding")(raw))
            except Exception:  # noqa: BLE001 - unreadable metadata compares by its text
                pass
        return DomainMetadata(kind, " ".join(raw.split()))

    return side(fields.get("entry", "")), side(fields.get("exit", ""))


class DomainMap:
    """`metadata_id(instr)`: equal for instructions whose domains carry matching metadata."""

    def __init__(self, comp: Computation):
        self._id: dict[Instruction, int] = {}
        ids: dict[DomainMetadata, int] = {}
        if not any(i.opcode is Opcode.DOMAIN for i in comp.instructions):
            return  # one domain without metadata: every id is 0
        order = comp.post_order()
        position = {instr: k for k, instr in enumerate(order)}
        for start in order:
            if start.opcode is Opcode.DOMAIN or start in self._id:
                continue
            members, enters, exits = self._expand(start)
            metadata = None
            if enters:
                sides = domain_sides(min(enters, key=position.__getitem__))
                metadata = sides[0] if sides else None
            elif exits:
                sides = domain_sides(min(exits, key=position.__getitem__))
                metadata = sides[1] if sides else None
            ident = 0 if metadata is None else ids.setdefault(metadata, len(ids) + 1)
            for m in members:
                self._id[m] = ident

    @staticmethod
    def _expand(start: Instruction) -> tuple[list[Instruction], set[Instruction], set[Instruction]]:
        members, enters, exits = [], set(), set()
        seen = {start}
        work = [start]
        while work:
            x = work.pop()
            members.append(x)
            for op in x.operands:
                if op.opcode is Opcode.DOMAIN:
                    enters.add(op)
                elif op not in seen:
                    seen.add(op)
                    work.append(op)
            for user in x.users:
                if user.opcode is Opcode.DOMAIN:
                    exits.add(user)
                elif user not in seen:
                    seen.add(user)
                    work.append(user)
        return members, enters, exits

    def metadata_id(self, instr: Instruction) -> int:
        return self._id.get(instr, 0)
