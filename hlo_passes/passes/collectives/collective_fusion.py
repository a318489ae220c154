"""collective-fusion: the collective passes in a sound order, as one pass.

    all-reduce-simplifier      drop collectives that need no communication first, so that
    all-reduce-reassociate     nothing below wastes effort on them; fold all-reduce(a)+all-reduce(b)
    reduce-scatter-creator     before combining (it removes all-reduces outright);
    all-reduce-combiner        then turn all-reduce+slice into reduce-scatter (it needs the
    all-gather-combiner        single all-reduce it would otherwise lose to a combiner);
    reduce-scatter-combiner    then merge what is left, kind by kind;
    collective-permute-combiner
    async-collective-creator   (only with async=true) last, on the merged collectives.

    hlo-passes run step.hlo --passes 'collective-fusion{combine-threshold-in-bytes=1048576}'

Options (XLA's names) are forwarded to the sub-passes that take them.  Sub-pass remarks are collected
under this pass.  The pass never fails a pipeline: a sub-pass that raises is reported as a
remark, the module is restored to its state before that sub-pass (the pass manager's
rollback policy, which also undoes a sub-pass whose output the structural verifier
rejects), and the rest still run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hlo_passes.ir.module import Module
from hlo_passes.passes.collectives.all_gather_combiner import AllGatherCombiner
from hlo_passes.passes.collectives.all_reduce_combiner import (DEFAULT_THRESHOLD_BYTES,
                                                                DEFAULT_THRESHOLD_COUNT, AllReduceCombiner)
from hlo_passes.passes.collectives.all_reduce_reassociate import AllReduceReassociate
from hlo_passes.passes.collectives.all_reduce_simplifier import AllReduceSimplifier
from hlo_passes.passes.collectives.async_collective_creator import AsyncCollectiveCreator
from hlo_passes.passes.collectives.collective_permute_combiner import CollectivePermuteCombiner
from hlo_passes.passes.collectives.reduce_scatter_combiner import ReduceScatterCombiner
from hlo_passes.passes.collectives.reduce_scatter_creator import ReduceScatterCreator
from hlo_passes.passes.manager import PassManager
from hlo_passes.passes.pass_base import ModulePass, option
from hlo_passes.passes.registry import register_pass


@register_pass
class CollectiveFusion(ModulePass):
    name = "collective-fusion"
    summary = "Simplify, reassociate, create reduce-scatters and combine collectives (a pipeline)"

    @dataclass(frozen=True)
    class Options:
        combine_threshold_in_bytes: int = option(DEFAULT_THRESHOLD_BYTES, "largest combined collective, in bytes")
        combine_threshold_count: int = option(DEFAULT_THRESHOLD_COUNT, "most collectives merged into one")
        combine_by_dim: bool = option(True, "all-gather and reduce-scatter combiners: merge only the same dimension")
        combine_different_dtypes: bool = option(True, "all-gather-combiner: merge different element types")
        combine_while_loops: bool = option(True, "all-gather and reduce-scatter combiners: merge inside while loops")
        reduce_scatter_form: Literal["packed", "variadic"] = option(
            "packed", "reduce-scatter-combiner form: packed or variadic")
        reassociate: bool = option(True, "run all-reduce-reassociate")
        create_reduce_scatter: bool = option(True, "run reduce-scatter-creator")
        combine_permutes: bool = option(True, "run collective-permute-combiner")
        make_async: bool = option(False, "finish with async-collective-creator (XLA CPU runs it synchronously)")

    def sub_passes(self) -> list[ModulePass]:
        o = self.options
        limits = dict(combine_threshold_in_bytes=o.combine_threshold_in_bytes,
                      combine_threshold_count=o.combine_threshold_count)
        passes: list[ModulePass] = [AllReduceSimplifier()]
        if o.reassociate:
            passes.append(AllReduceReassociate())
        if o.create_reduce_scatter:
            passes.append(ReduceScatterCreator())
        passes += [
            AllReduceCombiner(**limits),
            AllGatherCombiner(**limits, combine_by_dim=o.combine_by_dim,
                              combine_different_dtypes=o.combine_different_dtypes,
                              combine_while_loops=o.combine_while_loops),
            ReduceScatterCombiner(**limits, combine_by_dim=o.combine_by_dim,
                                  combine_while_loops=o.combine_while_loops, form=o.reduce_scatter_form),
        ]
        if o.combine_permutes:
            passes.append(CollectivePermuteCombiner(**limits))
        if o.make_async:
            passes.append(AsyncCollectiveCreator())
        return passes

    def run(self, module: Module) -> bool:
        manager = PassManager(self.sub_passes(), verify_each=True, on_failure="rollback")
        changed = manager.run(module)
        self.remarks.extend(manager.remarks)
        return changed
