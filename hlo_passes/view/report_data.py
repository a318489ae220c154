"""What `hlo-passes run --report` records while a pipeline runs: per pass its time, whether it
changed the module, its remarks (with source lines), a structural diff and the statistics
before and after; then the final module's view.

    report = PassReport(input_name, pipeline_text)
    manager = PassManager(passes, dump=report.observe)      # or called from another dump callback
    manager.run(module)
    html = report.html(manager, module)

The diff needs the module as it was before the pass: a `Module.clone()` taken before each pass.
"""

from __future__ import annotations

from hlo_passes.diff import diff_modules
from hlo_passes.ir.module import Module
from hlo_passes.passes.pass_base import ModulePass
from hlo_passes.stats import module_stats
from hlo_passes.view.diff_data import diff_data, stats_data
from hlo_passes.view.module_data import module_data
from hlo_passes.view.page import render_page

# Per pass; the page of a pass that rewrites a whole training step stays small.
MAX_DIFF_CHANGES = 2_000


class PassReport:
    def __init__(self, input_name: str, pipeline: str):
        self.input_name = input_name
        self.pipeline = pipeline
        self.passes: list[dict] = []
        self._before: Module | None = None
        self._before_stats: dict = {}
        self._seen_remarks = 0

    def observe(self, index: int, p: ModulePass, module: Module, when: str) -> None:
        """The PassManager's dump callback: `when` is "before" or "after" pass `index`."""
        if when == "before":
            self._before = module.clone()
            self._before_stats = stats_data(module_stats(module))
            self._seen_remarks = len(p.remarks)
            return
        diff = diff_data(diff_modules(self._before, module), "before", "after", MAX_DIFF_CHANGES,
                         modules=(self._before, module))
        self._before = None
        self.passes.append({
            "name": p.pipeline_text(), "seconds": 0.0, "changed": False,
            "remarks": [{"kind": r.kind, "message": r.message, "instruction": r.instruction,
                         "computation": r.computation, "source": r.source} for r in p.remarks[self._seen_remarks:]],
            "diff": diff, "before": self._before_stats, "after": stats_data(module_stats(module)),
        })

    def data(self, manager, module: Module, error: str = "") -> dict:
        """Page data; timings and "changed" come from the manager's records."""
        for rec, entry in zip(manager.records, self.passes):
            entry["seconds"] = rec.seconds
            entry["changed"] = rec.changed
        return {"input": self.input_name, "pipeline": self.pipeline, "error": error,
                "total_seconds": sum(r.seconds for r in manager.records), "passes": self.passes,
                "final": module_data(module, source=f"{self.input_name} after {self.pipeline}")}

    def html(self, manager, module: Module, error: str = "") -> str:
        return render_page("report", f"pass report: {self.pipeline}", self.data(manager, module, error))
