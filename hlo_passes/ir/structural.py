"""Structural identity of instructions and computations, for passes that merge look-alikes.

Two computations are structurally equal when they would compute the same thing for the
same reason: the same parameter shapes and, walking both in post order, the same
opcodes, shapes, typed attributes (metadata aside), literals, operand wiring (by
position in the walk, not by name), control edges and, recursively, structurally equal
callees.  Names never matter, so the two reducers JAX emits for two `psum`s

    region_0.1 { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }
    region_1.2 { x = f32[] parameter(0)  y = f32[] parameter(1)  ROOT z = f32[] add(x, y) }

have equal fingerprints, while `add(b, a)` or `maximum(a, b)` do not (structure, not
meaning: commutativity is not looked at).

`StructuralFingerprints` caches one fingerprint per computation for the life of the
object; a pass makes one per run and must not change a computation after taking its
fingerprint (visit callees before callers and change each computation before its callers
ask).  Fingerprints are compared exactly (the full structure, not only a hash), so equal
fingerprints never hide a collision.
"""

from __future__ import annotations

from typing import Any, Hashable, cast

from hlo_passes.ir.computation import Computation
from hlo_passes.ir.instruction import Instruction

# Attributes that do not change what an instruction computes.  Control edges are compared
# structurally (by position), not through their attribute text, which names instructions.
IGNORED_ATTRIBUTES = frozenset({"metadata", "control-predecessors"})


def attribute_value(instr: Instruction, key: str) -> Hashable:
    """The typed value of `instr`'s attribute `key`; its text when no reader understands it
    or the value is not hashable."""
    try:
        value = instr.attr(key)
        hash(value)
    except (TypeError, ValueError):
        return instr.attributes[key].text(key)
    return cast(Hashable, value)


def compared_attributes(instr: Instruction, ignore: frozenset[str] = frozenset()) -> tuple[Any, ...]:
    """(key, value) pairs of the attributes that decide what `instr` computes, sorted by key;
    called computations and the keys in `ignore` left out."""
    return tuple(sorted((k, attribute_value(instr, k)) for k in instr.attributes
                        if k not in IGNORED_ATTRIBUTES and k not in ignore and k not in instr.called))


class Fingerprint:
    """A computation's structure as a nested tuple, with its hash computed once."""

    __slots__ = ("structure", "_hash")

    def __init__(self, structure: tuple[Any, ...]):
        self.structure = structure
        self._hash = hash(structure)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        return (isinstance(other, Fingerprint) and self._hash == other._hash
                and self.structure == other.structure)

    def __repr__(self) -> str:
        return f"<Fingerprint {self._hash & 0xFFFFFFFF:08x}>"


class StructuralFingerprints:
    """Fingerprints of computations, computed on first use and cached per computation."""

    def __init__(self, *, layout_sensitive: bool = True):
        self.layout_sensitive = layout_sensitive
        self._cache: dict[Computation, Fingerprint] = {}

    def of(self, comp: Computation) -> Fingerprint:
        found = self._cache.get(comp)
        if found is None:
            found = self._cache[comp] = Fingerprint(self._structure(comp))
        return found

    def equal(self, a: Computation, b: Computation) -> bool:
        return a is b or self.of(a) == self.of(b)

    def called(self, instr: Instruction) -> tuple[Any, ...]:
        """(key, fingerprint or tuple of fingerprints) for each computation `instr` calls."""
        if not instr.called:  # most instructions (CSE asks of every one)
            return ()
        return tuple(sorted(
            (k, tuple(self.of(c) for c in v) if isinstance(v, tuple) else self.of(v))
            for k, v in instr.called.items()))

    def shape_key(self, instr: Instruction) -> Hashable:
        return instr.shape if self.layout_sensitive else instr.shape.to_hlo(with_layout=False)

    def _structure(self, comp: Computation) -> tuple[Any, ...]:
        index: dict[Instruction, int] = {}
        entries = []
        for instr in comp.post_order():
            index[instr] = len(index)
            entries.append((
                instr.opcode, self.shape_key(instr), instr.parameter_number,
                tuple(index[op] for op in instr.operands),
                tuple(sorted(index[p] for p in instr.control_predecessors)),
                compared_attributes(instr), self.called(instr), instr.literal,
            ))
        root = index[comp.root] if comp.root is not None else None
        return (len(comp.parameters), tuple(entries), root)
