"""PassManager: the one way to run passes.  It runs them in order, collects remarks and
timings, and optionally checks the module with the structural verifier before the first
pass and after every pass, so a broken module is blamed on the pass that broke it.

    manager = PassManager.from_pipeline("call-inliner,cse,dce", verify_each=True)
    changed = manager.run(module)
    for r in manager.records: print(r.name, r.changed, f"{r.seconds:.3f}s")
    for r in manager.remarks: print(r.format())

Policies, for the callers that need them:

* `on_failure="raise"` (default): a pass that raises gets a note naming it (and its index in
  the pipeline); a pass whose output the verifier rejects raises PassFailed with the
  verifier's errors, each showing the offending instruction with a few lines of context.
* `on_failure="rollback"`: a snapshot of the module is taken before each pass
  (`Module.snapshot`: what a clone would hold, kept compactly); a pass that raises, or whose
  output the verifier or an invariant rejects, is undone (the module is restored from it)
  and reported as a `missed` remark, and the pipeline goes on (collective-fusion runs its
  sub-passes this way).
* `invariants`: checks run after every pass that changed the module (the jax.jit hook: the
  entry signature JAX fixed must not change); a failed one is treated like a verifier error.
* `after_each(index, pass, module, changed)`: an observer (dumps, numerical bisection).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, cast

from hlo_passes.ir.module import Module
from hlo_passes.passes.pass_base import ModulePass, Remark
from hlo_passes.passes.pipeline import parse_pipeline
from hlo_passes.verifier import VerifierError, verify_module


class PassFailed(Exception):
    """A pass left a module that the structural verifier rejects (or got one: pass_name "input")."""

    def __init__(self, pass_name: str, message: str, errors: list[VerifierError] | None = None):
        super().__init__(f"pass {pass_name}: {message}" if pass_name != "input" else message)
        self.pass_name = pass_name
        self.errors = errors or []


@dataclass
class PassRecord:
    name: str  # the pass's pipeline text, options included
    changed: bool
    seconds: float
    remarks: int = 0
    cpu_seconds: float = 0.0
    peak_memory_bytes: int = 0  # the process's peak resident memory when the pass ended


# Called as dump(index, pass, module, "before"|"after").
DumpCallback = Callable[[int, ModulePass, Module, str], None]
# An invariant returns what is wrong with the module ("" or None when nothing is).
Invariant = Callable[[Module], "str | None"]


@dataclass
class PassManager:
    passes: list[ModulePass]
    verify_each: bool = False
    dump: DumpCallback | None = None
    on_failure: Literal["raise", "rollback"] = "raise"
    invariants: list[Invariant] = field(default_factory=list)
    after_each: Callable[[int, ModulePass, Module, bool], None] | None = None
    remarks: list[Remark] = field(default_factory=list)
    records: list[PassRecord] = field(default_factory=list)
    failed_pass: str | None = None  # the pass that raised or broke the module (on_failure="raise")

    @classmethod
    def from_pipeline(cls, text: str, **kwargs: Any) -> "PassManager":
        return cls(parse_pipeline(text).passes, **kwargs)

    def run(self, module: Module) -> bool:
        """Run every pass in order; True when any of them changed the module."""
        if self.verify_each:
            errors = verify_module(module)
            if errors:
                raise PassFailed("input", _describe("the input module is malformed (before any pass ran)",
                                                    errors), errors)
        changed_any = False
        for i, p in enumerate(self.passes):
            if self.dump is not None:
                self.dump(i, p, module, "before")
            snapshot = module.snapshot() if self.on_failure == "rollback" else None
            start, cpu_start = time.perf_counter(), time.process_time()
            seen = len(p.remarks)
            problem: PassFailed | str | None
            try:
                changed = bool(p.run(module))
                problem = self._check(p, module, changed)
            except Exception as e:
                if snapshot is None or isinstance(e, PassFailed):
                    self.failed_pass = p.name
                    e.add_note(f"while running pass {i + 1} of {len(self.passes)}: {p.pipeline_text()}")
                    raise
                changed, problem = False, f"raised {type(e).__name__}: {e}"
            finally:
                self.remarks.extend(p.remarks[seen:])
            self.records.append(PassRecord(p.pipeline_text(), changed, time.perf_counter() - start,
                                           len(p.remarks) - seen, time.process_time() - cpu_start,
                                           _peak_memory_bytes()))
            if self.dump is not None:  # a failed pass's output too: it is what there is to debug
                self.dump(i, p, module, "after")
            if problem is not None:
                if snapshot is None:
                    self.failed_pass = p.name
                    raise cast(PassFailed, problem)  # without rollback a raising pass re-raised above
                module.restore(snapshot)
                changed = self.records[-1].changed = False
                why = problem.args[0].removeprefix(f"pass {p.name}: ") if isinstance(problem, PassFailed) else problem
                self.remarks.append(Remark(p.name, f"{p.name} failed ({why}); its changes were undone",
                                           kind="missed"))
            snapshot = None  # (not kept while the next pass takes its own)
            if self.after_each is not None:
                self.after_each(i, p, module, changed)
            changed_any |= changed
        return changed_any

    def _check(self, p: ModulePass, module: Module, changed: bool) -> "PassFailed | None":
        """What is wrong with a pass's output (the verifier; the invariants when it changed
        something), or None.  Verified even when the pass says it changed nothing: a pass that
        edits the module and answers False is exactly the bug to catch here."""
        if self.verify_each:
            errors = verify_module(module)
            if errors:
                return PassFailed(p.name, _describe("the structural verifier rejects its output", errors), errors)
        if changed:
            for invariant in self.invariants:
                problem = invariant(module)
                if problem:
                    return PassFailed(p.name, problem)
        return None

    def timing_report(self) -> str:
        """One line per pass: changed or not, wall and CPU time, the process's peak memory when
        it ended (a pass that raised the peak shows it first), remarks."""
        width = max((len(r.name) for r in self.records), default=0)
        return "\n".join(f"  {r.name:<{width}}  {'changed  ' if r.changed else 'no change'}  "
                         f"{r.seconds * 1000:9.1f} ms  cpu {r.cpu_seconds * 1000:9.1f} ms  "
                         f"peak {r.peak_memory_bytes / 2**20:7.1f} MiB  "
                         f"{r.remarks} remark{'s' if r.remarks != 1 else ''}"
                         for r in self.records)


def _peak_memory_bytes() -> int:
    """The process's peak resident set so far (0 where the platform does not say)."""
    try:
        import resource
    except ImportError:  # not on POSIX
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def _describe(headline: str, errors: list[VerifierError], limit: int = 5) -> str:
    shown = "\n".join(e.format() for e in errors[:limit])
    more = f"\n({len(errors) - limit} more)" if len(errors) > limit else ""
    return f"{headline}:\n{shown}{more}"


def structural_problems(module: Module) -> str:
    """What the structural verifier finds wrong with `module` ("" when fine)."""
    return "\n".join(e.format() for e in verify_module(module))
