"""A structural diff (`hlo_passes.diff.ModuleDiff`) and module statistics as page data."""

from __future__ import annotations

from hlo_passes.diff import ModuleDiff
from hlo_passes.ir.module import Module
from hlo_passes.printer import print_instruction
from hlo_passes.stats import ModuleStats

# A pass that rewrites a whole training step changes tens of thousands of lines; a page shows
# the first ones and says how many it left out.
MAX_CHANGES = 50_000


def diff_data(diff: ModuleDiff, a: str, b: str, max_changes: int = MAX_CHANGES,
              modules: tuple[Module, Module] | None = None) -> dict:
    """Page data of `diff`; with `modules` (A, B), the instructions of the computations only one
    of them has are listed too (they count against `max_changes`)."""
    shown, omitted, comps = 0, 0, []
    for comp in diff.computations:
        if not comp.changes:
            continue
        changes = []
        for ch in comp.changes:
            if shown >= max_changes:
                omitted += 1
                continue
            changes.append({"kind": ch.kind, "before": ch.before, "after": ch.after, "what": ch.what})
            shown += 1
        comps.append({"name": comp.name, "changes": changes})
    whole: dict[str, list[dict]] = {"removed": [], "added": []}
    for kind, names, module in (("removed", diff.computations_removed, modules[0] if modules else None),
                                ("added", diff.computations_added, modules[1] if modules else None)):
        for name in names:
            lines = []
            if module is not None:
                for instr in module.computation(name).instructions:
                    if shown >= max_changes:
                        omitted += 1
                        continue
                    lines.append(print_instruction(instr).strip())
                    shown += 1
            whole[kind].append({"name": name, "lines": lines})
    return {"a": a, "b": b, "equal": diff.equal, "removed": whole["removed"], "added": whole["added"],
            "computations": comps, "omitted": omitted}


def stats_data(stats: ModuleStats) -> dict:
    """`--stats`' numbers: instructions, FLOPs, and per collective kind [count, bytes per device]."""
    return {"instructions": stats.instructions, "flops": stats.flops,
            "collectives": {k: [stats.collective_count[k], stats.collective_bytes[k]]
                            for k in sorted(stats.collective_count)}}
