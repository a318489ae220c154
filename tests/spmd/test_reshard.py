"""reshard: every kind of step, checked by the collectives it emits (hand-derived) and by
running the partitioned module on 8 devices against the unpartitioned one."""

from collections import Counter

import pytest

from hlo_passes import parse_module, print_module
from hlo_passes.ir import ArrayShape, PrimitiveType
from hlo_passes.parse.attribute_reader import reader_for
from hlo_passes.passes.spmd.partition_context import tile_map
from hlo_passes.passes.spmd.cost_model import DEFAULT
from hlo_passes.passes.spmd.reshard import cost, plan
from hlo_passes.passes.spmd.spmd_partitioner import SpmdPartitioner
from hlo_passes.runtime import verify_equivalent

S = reader_for("sharding")
R = "{replicated}"
ROW8, COL8 = "{devices=[8,1]<=[8]}", "{devices=[1,8]<=[8]}"

# (from, to, shape, expected collectives)
CASES = [
    pytest.param(R, ROW8, "16,8", {}, id="replicated-to-tiled-is-a-local-slice"),
    pytest.param(ROW8, R, "16,8", {"all-gather": 1}, id="tiled-to-replicated-all-gathers"),
    pytest.param(ROW8, COL8, "16,8", {"all-to-all": 1}, id="split-moves-dim0-to-dim1"),
    pytest.param(ROW8, COL8, "10,6", {"all-to-all": 1}, id="all-to-all-uneven-pads-and-trims"),
    pytest.param("{devices=[8,1]7,6,5,4,3,2,1,0}", ROW8, "16,8", {"collective-permute": 1},
                 id="same-grid-other-device-order-permutes"),
    pytest.param("{devices=[2,4]<=[8]}", "{devices=[2,4]<=[4,2]T(1,0)}", "16,8", {"collective-permute": 1},
                 id="2d-grid-transposed-devices-permutes"),
    pytest.param("{devices=[4,1,2]<=[8] last_tile_dim_replicate}", ROW8, "16,8", {},
                 id="partially-replicated-to-finer-is-local"),
    pytest.param("{devices=[4,2]<=[8]}", R, "10,6", {"all-gather": 2}, id="2d-uneven-to-replicated"),
    pytest.param("{devices=[1,2,4]<=[4,2]T(1,0) last_tile_dim_replicate}",
                 "{devices=[2,1,4]<=[4,2]T(1,0) last_tile_dim_replicate}", "16,8", {"all-to-all": 1},
                 id="partial-replication-all-to-all-in-groups"),
    pytest.param(ROW8, "{devices=[2,4]<=[8]}", "16,8", {"all-to-all": 1},
                 id="minor-factor-of-split-moves-to-other-dim"),
    pytest.param("{devices=[4,2]<=[8]}", "{devices=[2,4]<=[4,2]T(1,0)}", "16,8",
                 {"all-to-all": 1, "collective-permute": 1}, id="mesh-axes-swap-dims-all-to-all-then-permute"),
    pytest.param("{devices=[2,1,2,2]<=[2,2,2]T(0,2,1) last_tile_dim_replicate}", "{devices=[1,4,2]<=[2,4]T(1,0)}",
                 "8,16,64", {"all-to-all": 1, "collective-permute": 1},
                 id="slice-replicas-then-all-to-all-then-permute"),
    pytest.param(ROW8, "{devices=[4,1,2]<=[8] last_tile_dim_replicate}", "16,8", {"all-gather": 1},
                 id="coarser-partial-replication-gathers-pairs"),
    pytest.param("{devices=[2,4]<=[8]}", "{devices=[2,2,2]<=[8] last_tile_dim_replicate}", "10,6", {"all-gather": 1},
                 id="coarser-partial-replication-uneven"),
    pytest.param("{devices=[4,2]<=[8]}", "{devices=[4,1,2]<=[8] last_tile_dim_replicate}", "16,8", {"all-gather": 1},
                 id="tiled-to-partially-replicated-gathers-one-dim"),
    pytest.param("{devices=[4,1,2]<=[8] last_tile_dim_replicate}", "{devices=[2,4]<=[8]}", "16,8",
                 {"all-to-all": 1}, id="partially-replicated-slice-then-all-to-all"),
    pytest.param("{devices=[4,2]<=[8]}", "{devices=[2,4]<=[8]}", "16,8", {"all-to-all": 1, "collective-permute": 1},
                 id="refactor-grid-4x2-to-2x4-moved-factor-lands-major"),
]


def module_text(src: str, dst: str, shape: str) -> str:
    return (f"HloModule reshard\n\nENTRY main {{\n  x = f32[{shape}] parameter(0), sharding={src}, "
            f"metadata={{op_name=\"x\"}}\n  ROOT y = f32[{shape}] custom-call(x), custom_call_target=\"Sharding\", "
            f"sharding={dst}, metadata={{op_name=\"constraint\" source_file=\"model.py\" source_line=7}}\n}}\n")


@pytest.mark.parametrize("src,dst,shape,expected", CASES)
def test_reshard(src, dst, shape, expected):
    text = module_text(src, dst, shape)
    module = parse_module(text)
    SpmdPartitioner(num_partitions=8).run(module)
    out = print_module(module)
    collectives = [i for i in module.all_instructions() if i.opcode.is_collective]
    assert dict(Counter(i.opcode.value for i in collectives)) == expected, out
    assert "custom_call_target=\"Sharding\"" not in out
    for c in collectives:  # inserted collectives point at the op that caused them
        assert c.metadata.source_line == 7
    assert len({c.channel_id for c in collectives}) == len(collectives)
    report = verify_equivalent(text, out, num_devices=8)
    assert report.ok, report.format() + "\n" + out


def test_plan_prefers_cheapest_step_and_costs_bytes():
    shape = ArrayShape(PrimitiveType.F32, (16, 8))
    row, col = tile_map(S(ROW8), 2, 8), tile_map(S(COL8), 2, 8)
    assert [s.kind for s in plan(tile_map(S(R), 2, 8), row, shape)] == ["slice"]
    assert [s.kind for s in plan(row, col, shape)] == ["all-to-all"]
    # all-gather of a [2,8] f32 tile over 8 devices receives 7 tiles of 64 bytes
    gather = cost(S(ROW8), S(R), shape, 8)
    assert (gather.bytes, gather.collectives) == (7 * 2 * 8 * 4, 1)
    sliced = cost(S(R), S(ROW8), shape, 8)
    assert (sliced.bytes, sliced.collectives) == (0, 0)  # a local slice: it only copies
    assert cost(S(ROW8), S(COL8), shape, 8) < gather


def test_partial_gather_is_over_the_subgroup_only():
    """[8,1] -> [4,1,2] replicated pairs: each device receives one neighbour's tile, not seven."""
    shape = ArrayShape(PrimitiveType.F32, (16, 8))
    steps = plan(tile_map(S(ROW8), 2, 8), tile_map(S("{devices=[4,1,2]<=[8] last_tile_dim_replicate}"), 2, 8), shape)
    assert [(s.kind, s.dims, s.bytes) for s in steps] == [("all-gather", (0, 2), 2 * 8 * 4)]


def test_grid_plan_slices_replicas_before_moving_data():
    """The 3-D mesh case: replicas split their tile first, so the all-to-all moves half as much."""
    shape = ArrayShape(PrimitiveType.F32, (8, 16, 64))
    src = tile_map(S("{devices=[2,1,2,2]<=[2,2,2]T(0,2,1) last_tile_dim_replicate}"), 3, 8)
    dst = tile_map(S("{devices=[1,4,2]<=[2,4]T(1,0)}"), 3, 8)
    assert [s.kind for s in plan(src, dst, shape)] == ["slice", "all-to-all", "permute"]


# --------------------------------------------------- random shardings --
import hypothesis.strategies as st  # noqa: E402
import numpy as np  # noqa: E402
from hypothesis import given, settings  # noqa: E402

from hlo_passes.ir.sharding import Sharding, SubgroupKind  # noqa: E402
from hlo_passes.passes.spmd.partition_context import same_placement  # noqa: E402
from hlo_passes.passes.spmd.reshard import _greedy_plan, steps_estimate  # noqa: E402


def _tiled_over(draw, rank: int, n: int, counts_allowed: tuple[int, ...]):
    """A tiled sharding of a rank-`rank` array over n devices in a random device order, with
    the devices left over replicating (last_tile_dim_replicate)."""
    counts, left = [], n
    for _ in range(rank):
        t = draw(st.sampled_from([c for c in counts_allowed if left % c == 0]))
        counts.append(t)
        left //= t
    order = draw(st.permutations(range(n)))
    if left == n:
        return Sharding.replicated()
    arr = np.asarray(order).reshape(counts + ([left] if left > 1 else []))
    return Sharding.tiled(arr, (SubgroupKind.REPLICATED,) if left > 1 else ())


@st.composite
def reshard_case(draw, n: int = 8, counts: tuple[int, ...] = (1, 2, 4, 8),
                 sizes: tuple[int, ...] = (4, 6, 7, 8, 10, 16)):
    """(dims, source, target): a random array shape and two random tilings of it over n
    devices.  On 6 devices (tile counts 2 and 3, which do not divide each other) a target's
    tiling often does not refine the source's (2 ways wanted 3)."""
    rank = draw(st.integers(1, 3))
    dims = tuple(draw(st.sampled_from(sizes)) for _ in range(rank))
    return dims, _tiled_over(draw, rank, n, counts), _tiled_over(draw, rank, n, counts)


ON_6 = dict(n=6, counts=(1, 2, 3, 6), sizes=(3, 5, 6, 7, 9, 12))


def _check_plan(dims: tuple[int, ...], src: Sharding, dst: Sharding, n: int) -> None:
    shape = ArrayShape(PrimitiveType.F32, dims)
    a, b = tile_map(src, len(dims), n), tile_map(dst, len(dims), n)
    steps = plan(a, b, shape)
    if steps:
        assert same_placement(steps[-1].result, b)
    else:
        assert same_placement(a, b)
    greedy = _greedy_plan(a, b, dims, 4)
    assert not steps_estimate(greedy, dims, 4, DEFAULT) < steps_estimate(steps, dims, 4, DEFAULT)
    for s in steps:  # every intermediate placement is a sharding (equal holders per tile)
        assert s.result.to_sharding() is not None


def _check_run(dims: tuple[int, ...], src: Sharding, dst: Sharding, n: int) -> None:
    text = module_text(src.to_hlo(), dst.to_hlo(), ",".join(map(str, dims)))
    module = parse_module(text)
    SpmdPartitioner(num_partitions=n).run(module)
    out = print_module(module)
    report = verify_equivalent(text, out, num_devices=n)
    assert report.ok, report.format() + "\n" + out


@settings(max_examples=300, deadline=None)
@given(reshard_case())
def test_plan_reaches_the_target_and_never_costs_more_than_greedy(case):
    _check_plan(*case, 8)


@settings(max_examples=12, deadline=None)
@given(reshard_case())
def test_random_reshards_run_correctly_on_8_devices(case):
    _check_run(*case, 8)


@settings(max_examples=300, deadline=None)
@given(reshard_case(**ON_6))
def test_plans_on_6_devices_reach_the_target_and_never_cost_more_than_greedy(case):
    _check_plan(*case, 6)


@settings(max_examples=12, deadline=None)
@given(reshard_case(**ON_6))
def test_random_reshards_run_correctly_on_6_devices(case):
    _check_run(*case, 6)
