"""HTML views of modules, pass runs and diffs: one self-contained file each.

    from hlo_passes.view import module_html, diff_html
    write_text("step.html", module_html(module, source="step.hlo"))

The page data is built here in Python (`module_data`, `diff_data`, `PassReport`), deterministic
and snapshot-tested; the page draws it with `assets/*.js` and lays graphs out with the vendored
dagre library (`vendor/`).  See README "Seeing a module".
"""

from __future__ import annotations

from hlo_passes.diff import diff_modules
from hlo_passes.ir.module import Module
from hlo_passes.stats import module_stats
from hlo_passes.view.diff_data import diff_data, stats_data
from hlo_passes.view.module_data import module_data
from hlo_passes.view.page import render_page
from hlo_passes.view.report_data import PassReport


def module_html(module: Module, source: str = "") -> str:
    return render_page("view", module.name, module_data(module, source))


def diff_html(a: Module, b: Module, name_a: str, name_b: str) -> str:
    data = {"diff": diff_data(diff_modules(a, b), name_a, name_b, modules=(a, b)),
            "stats_a": stats_data(module_stats(a)), "stats_b": stats_data(module_stats(b))}
    return render_page("diff", f"diff {name_a} {name_b}", data)


__all__ = ["PassReport", "diff_html", "module_html", "module_data"]
