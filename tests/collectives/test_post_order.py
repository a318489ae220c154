"""`CombineOrder` against what XLA rebuilds after every merge: on random graphs of
collectives and arithmetic, after each merge of each combiner, the order of the remaining
candidates is the one a fresh `xla_post_order` gives and every reachability answer the one a
fresh `Reachability` gives.  A merge that the incremental update mishandled would change
which groups form (or let a later group close a cycle), so this guards the combiners'
grouping without needing the numerics."""

import random

import pytest

from hlo_passes.parse.module_parser import parse_module
from hlo_passes.passes.collectives.post_order import CombineOrder, Reachability, xla_post_order
from hlo_passes.passes.registry import lookup
from hlo_passes.verifier import verify_module
from tests.collectives.helpers import G2, G4, module

GROUPS = [G4, G2]


def random_body(rng: random.Random, size: int) -> str:
    """Values f32[8] (pool A) and f32[2] (pool B): arithmetic inside a pool, all-reduces on
    both, reduce-scatter A → B, all-gather B → A, slices A → B; a few control edges and dead
    collectives (those merges take the rebuild path); the root a tuple of some values."""
    lines = ["  p0 = f32[8] parameter(0)", "  p1 = f32[2] parameter(1)"]
    pools = {"A": ["p0"], "B": ["p1"]}
    shape = {"A": "f32[8]", "B": "f32[2]"}
    collectives: list[str] = []
    used: set[str] = set()
    for n in range(size):
        op = rng.choices(["add", "negate", "all-reduce", "reduce-scatter", "all-gather", "slice"],
                         [3, 2, 4, 2, 2, 1])[0]
        source = {"reduce-scatter": "A", "all-gather": "B", "slice": "A"}.get(op, rng.choice("AB"))
        kind = {"reduce-scatter": "B", "all-gather": "A", "slice": "B"}.get(op, source)
        x = rng.choice(pools[source][-6:])  # recent values: long chains as well as wide fans
        args = [x, rng.choice(pools[source])] if op == "add" else [x]
        attrs = {"add": "", "negate": "", "slice": ", slice={[0:2]}",
                 "all-reduce": f", {rng.choice(GROUPS)}, to_apply={rng.choice(['add', 'mx'])}",
                 "reduce-scatter": f", {G4}, dimensions={{0}}, to_apply=add",
                 "all-gather": f", {G4}, dimensions={{0}}"}[op]
        if collectives and rng.random() < 0.05:
            attrs += f", control-predecessors={{{rng.choice(collectives)}}}"
        name = f"v{n}"
        lines.append(f"  {name} = {shape[kind]} {op}({', '.join(args)}){attrs}")
        used.update(args)
        if op in ("all-reduce", "reduce-scatter", "all-gather"):
            collectives.append(name)
        pools[kind].append(name)
    outs = [v for v in pools["A"][1:] + pools["B"][1:] if v not in used or rng.random() < 0.3]
    keep = [v for v in outs if rng.random() < 0.9] or outs[:1]  # the rest stay dead (more walk starts)
    root_shape = ", ".join("f32[8]" if v in pools["A"] else "f32[2]" for v in keep)
    lines.append(f"  ROOT t = ({root_shape}) tuple({', '.join(keep)})")
    return "\n".join(lines)


def check_against_fresh(order: CombineOrder) -> None:
    comp = order.comp
    post = xla_post_order(comp)
    alive = order.candidates
    assert order.in_order(alive) == [x for x in post if x in alive]
    fresh = Reachability(post, {})
    for a in alive:
        for b in alive:
            assert order.reach.reaches(a, b) == fresh.reaches(a, b), (a.name, b.name)


@pytest.mark.parametrize("seed", range(60))
def test_kept_order_and_reachability_equal_rebuilt_ones(seed, monkeypatch):
    rng = random.Random(seed)
    text = module(random_body(rng, rng.randrange(20, 70)), "num_partitions=8" if seed % 2 else "replica_count=8")
    m = parse_module(text)
    incremental: list[bool] = []
    plain_merge = CombineOrder.merge

    def merge_and_check(self, members, combine):
        rebuilds = self.rebuilds
        plain_merge(self, members, combine)
        incremental.append(self.rebuilds == rebuilds)
        check_against_fresh(self)

    monkeypatch.setattr(CombineOrder, "merge", merge_and_check)
    for name in ("all-reduce-combiner", "all-gather-combiner", "reduce-scatter-combiner"):
        lookup(name)(combine_threshold_count=rng.choice([2, 3, 4, 256])).run(m)
        assert not verify_module(m), name
    assert any(incremental), "every merge rebuilt: the incremental update was not exercised"
