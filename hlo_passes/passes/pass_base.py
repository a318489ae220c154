"""The pass interface every rewrite implements.

A pass is a class with a kebab-case `name` (XLA's name where XLA has the pass),
a one-line `summary`, a frozen dataclass of typed `Options`, and
`run(module) -> bool` saying whether it changed the module.  Passes explain
their decisions with `self.remark(instruction, message)`; the pass manager
collects remarks for `--remarks`.

    @register_pass
    class DeadCodeElimination(ModulePass):
        '''Removes instructions whose results are unused ...'''
        name = "dce"
        summary = "Remove unused instructions without side effects"

        @dataclass(frozen=True)
        class Options:
            remove_dead_computations: bool = option(True, "also drop computations nobody calls")

        def run(self, module): ...
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import Module


def option(default: Any, help: str) -> Any:
    """A pass option field: its default and its one-line help."""
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class NoOptions:
    pass


@dataclass(frozen=True)
class Remark:
    """One decision a pass made, pointing at the instruction that caused it."""

    pass_name: str
    message: str
    instruction: str = ""
    computation: str = ""
    source: str = ""  # "file.py:12" from metadata or stack frames, when known
    kind: str = "note"  # "note" | "missed" (declined or fell back) | "applied"

    def format(self) -> str:
        where = f"%{self.instruction}" if self.instruction else ""
        if self.computation:
            where = f"{self.computation}/{where}" if where else self.computation
        src = f" [{self.source}]" if self.source else ""
        located = f"{where}{src}: " if where or src else ""  # module-wide remarks have no location
        return f"{self.pass_name}: {self.kind}: {located}{self.message}"


class ModulePass:
    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions

    def __init__(self, options: Any = None, **kwargs: Any):
        if options is None:
            options = self.Options(**kwargs)
        elif kwargs:
            options = dataclasses.replace(options, **kwargs)
        self.options = options
        self.remarks: list[Remark] = []

    def run(self, module: Module) -> bool:
        raise NotImplementedError

    # ------------------------------------------------------------ remarks --
    def remark(self, instr: Instruction | None, message: str, kind: str = "note") -> None:
        self.remarks.append(Remark(
            self.name, message,
            instruction=instr.name if instr is not None else "",
            computation=instr.parent.name if instr is not None and instr.parent is not None else "",
            source=source_location(instr) if instr is not None else "",
            kind=kind))

    @classmethod
    def option_fields(cls) -> list[dataclasses.Field[Any]]:
        return list(dataclasses.fields(cls.Options))

    def pipeline_text(self) -> str:
        """`name{opt=val,...}` with only the options that differ from their defaults."""
        from hlo_passes.passes.pipeline import format_pass  # cycle: pipeline imports this module

        return format_pass(self)


def source_location(instr: Instruction) -> str:
    """`file:line` for an instruction, from its metadata or the module's stack-frame tables."""
    meta = instr.metadata
    if meta is None:
        return ""
    if meta.source_file:
        return f"{meta.source_file}:{meta.source_line or 0}"
    frame = meta.stack_frame_id
    module = instr.parent.module if instr.parent is not None else None
    if frame is not None and module is not None:
        loc = module.tables.source_location(frame)
        if loc is not None:
            return f"{loc[0]}:{loc[1]}"
    return ""
