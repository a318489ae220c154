"""Per-opcode partitioning handlers, one module per op family, with replication as the default.

A handler is `handler(p, instr) -> PValue`: given the partitioner `p` (operands'
per-device values, resharding, cloning; typed as `HandlerContext`) it emits `instr`'s
per-device computation and returns the result with the sharding it has.  Handlers are
type-checked strictly (pyproject.toml), so a new one is annotated:

    @handles(Opcode.TRANSPOSE)
    def transpose(p: HandlerContext, instr: Instruction) -> PValue: ...
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol, Sequence, TypeVar

from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.opcode import Opcode
from hlo_passes.passes.spmd.partition_context import is_fully_manual

if TYPE_CHECKING:
    from hlo_passes.ir.computation import Computation
    from hlo_passes.ir.shape import Shape
    from hlo_passes.ir.sharding import Sharding
    from hlo_passes.passes.spmd.cost_model import Estimate
    from hlo_passes.passes.spmd.handlers import fallback, single_device, structural  # bound by _load_handlers at run time
    from hlo_passes.passes.spmd.partition_context import Emitter, PartitionContext, PValue

class HandlerContext(Protocol):
    """What a handler may use (the partitioner implements it: spmd_partitioner.Partitioner).

    `value(instr)` / `operand(instr, i)`: per-device values already emitted; `operand_as(instr,
    i, sharding)`: operand i resharded (the collectives shared between its users);
    `reshard(value, sharding)`; `move_cost(op, sharding)`: what `resharded` would pay; `target(instr)`: the sharding instr's result should have;
    `clone(instr, operands, shape)`: instr with new operands and per-device shape;
    `partition(comp, param_shardings, root_sharding)`: a called computation partitioned;
    `partition_manual(comp)`: a manual region's body copied; `remark`; `n` devices; `em` the
    emitter of the current computation (collectives, tables, masks); `ctx` the run (module,
    cost model, channel ids)."""

    @property
    def n(self) -> int: ...
    @property
    def em(self) -> "Emitter": ...
    @property
    def ctx(self) -> "PartitionContext": ...

    def value(self, instr: Instruction) -> "PValue": ...
    def operand(self, instr: Instruction, i: int) -> "PValue": ...
    def operand_as(self, instr: Instruction, i: int, sharding: "Sharding") -> Instruction: ...
    def resharded(self, op: Instruction, sharding: "Sharding") -> "PValue": ...
    def move_cost(self, op: Instruction, sharding: "Sharding") -> "Estimate": ...
    def reshard(self, value: "PValue", sharding: "Sharding") -> "PValue": ...
    def target(self, instr: Instruction) -> "Sharding": ...
    def clone(self, instr: Instruction, operands: Sequence[Instruction], shape: "Shape",
              **called: "Computation | tuple[Computation, ...]") -> Instruction: ...
    def partition(self, comp: "Computation", param_shardings: list["Sharding"], root_sharding: "Sharding | None",
                  *, name: str | None = None, manual: bool = False, shared: bool = False
                  ) -> tuple["Computation", "Sharding"]: ...
    def partition_manual(self, comp: "Computation") -> "Computation": ...
    def remark(self, instr: Instruction, message: str, kind: str = "note") -> None: ...


Handler = Callable[[HandlerContext, Instruction], "PValue"]
H = TypeVar("H", bound=Handler)  # a handler keeps its own signature (some take an optional reason)
_TABLE: dict[Opcode, Handler] = {}
_CUSTOM_CALLS: dict[str, Handler] = {}


def handles(*opcodes: Opcode) -> Callable[[H], H]:
    def register(fn: H) -> H:
        for op in opcodes:
            _TABLE[op] = fn
        return fn
    return register


def handles_custom_call(*targets: str) -> Callable[[H], H]:
    def register(fn: H) -> H:
        for t in targets:
            _CUSTOM_CALLS[t] = fn
        return fn
    return register


def _load_handlers() -> None:
    """Import every module of this package (each registers its handlers), like passes are found:
    a new handler family is a new module here, with no list to edit."""
    if _LOADED:
        return
    import importlib
    import pkgutil

    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
    _LOADED.append(True)


_LOADED: list[bool] = []


def handler_for(instr: Instruction) -> Handler:
    if not _LOADED:
        # Once: the handler modules import this package (a cycle at import time).  Loading them
        # binds them here too (`structural`, `fallback`, `single_device`), as importing a submodule does.
        _load_handlers()

    if is_fully_manual(instr.sharding if "sharding" in instr.attributes else None) and not (
            instr.opcode is Opcode.CUSTOM_CALL and instr.custom_call_target in _CUSTOM_CALLS):
        return structural.manual
    if single_device.runs_on_one_device(instr):
        return single_device.on_its_device
    if instr.opcode is Opcode.CUSTOM_CALL:
        return _CUSTOM_CALLS.get(instr.custom_call_target or "", fallback.replicate)
    return _TABLE.get(instr.opcode, fallback.replicate)
