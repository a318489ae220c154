"""PassManager: runs a pipeline, collects remarks and timings, and optionally
checks the module after every pass with the structural verifier."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from hlo_passes.ir.module import Module
from hlo_passes.passes.pass_base import ModulePass, Remark
from hlo_passes.passes.pipeline import parse_pipeline


class PassFailed(Exception):
    """A pass raised or left a module that the structural verifier rejects."""

    def __init__(self, pass_name: str, message: str):
        super().__init__(f"pass {pass_name}: {message}")
        self.pass_name = pass_name


@dataclass
class PassRecord:
    name: str
    changed: bool
    seconds: float


@dataclass
class PassManager:
    passes: list[ModulePass]
    verify_each: bool = False
    # Called as dump(index, pass, module, "before"|"after").
    dump: Callable[[int, ModulePass, Module, str], None] | None = None
    remarks: list[Remark] = field(default_factory=list)
    records: list[PassRecord] = field(default_factory=list)

    @classmethod
    def from_pipeline(cls, text: str, **kwargs) -> "PassManager":
        return cls(parse_pipeline(text).passes, **kwargs)

    def run(self, module: Module) -> bool:
        changed_any = False
        for i, p in enumerate(self.passes):
            if self.dump is not None:
                self.dump(i, p, module, "before")
            start = time.perf_counter()
            try:
                changed = bool(p.run(module))
            finally:
                self.remarks.extend(p.remarks)
            self.records.append(PassRecord(p.name, changed, time.perf_counter() - start))
            if self.dump is not None:
                self.dump(i, p, module, "after")
            if changed and self.verify_each:
                problems = structural_problems(module)
                if problems:
                    raise PassFailed(p.name, "the structural verifier rejects its output:\n" + problems)
            changed_any |= changed
        return changed_any


def structural_problems(module: Module) -> str:
    """What the structural verifier finds wrong with `module` ("" when fine).

    Until hlo_passes.verifier exists this checks that XLA's parser accepts the printed module."""
    try:
        from hlo_passes.verifier import verify_module
    except ImportError:
        from hlo_passes.printer import print_module
        from hlo_passes.runtime.hlo_proto import text_to_proto

        try:
            text_to_proto(print_module(module))
        except Exception as e:  # noqa: BLE001 - XLA's message is the diagnosis
            return str(e).strip()
        return ""
    errors = verify_module(module)
    return "\n".join(str(e) for e in errors)
