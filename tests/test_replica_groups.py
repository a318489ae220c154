"""Replica groups read from every spelling mean what XLA means: an all-reduce of
each device's id, run by XLA itself on 8 partitions, sums exactly the devices
our ReplicaGroups value puts in that device's group."""

import numpy as np
import pytest

from hlo_passes.parse.attribute_reader import reader_for

SPELLINGS = [
    "{{0,1,2,3},{4,5,6,7}}",
    "[2,4]<=[8]",
    "[4,2]<=[2,4]T(1,0)",
    "[2,4]<=[2,2,2]T(0,2,1)",
    "mesh['x'=4,'y'=2] {'x'}",
    "mesh['x'=4,'y'=2] {'y'}",
    "mesh['x'=4,'y'=2] {'x':(2)2}",
    "mesh['x'=4,'y'=2] {'x':(1)2}",
    "mesh['x'=2,'y'=2,'z'=2] {'x','z'}",
]


def run_all_reduce_of_device_ids(groups_text: str) -> list[float]:
    """Each of 8 partitions contributes its device id; XLA's all-reduce over the groups."""
    from hlo_passes.runtime import xla_backend

    text = f"""HloModule m, num_partitions=8
add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}
ENTRY e {{
  p = f32[1] parameter(0), sharding={{manual}}
  ROOT r = f32[1] all-reduce(p), channel_id=1, replica_groups={groups_text}, use_global_device_ids=true, to_apply=add, sharding={{manual}}
}}
"""
    exe = xla_backend.compile_hlo(text, num_partitions=8, spmd=True)
    out = exe.run([[np.array([float(d)], np.float32) for d in range(8)]])
    return [float(out[d][0][0]) for d in range(8)]


@pytest.mark.parametrize("text", SPELLINGS)
def test_groups_mean_what_xla_means(text):
    groups = reader_for("replica_groups")(text)
    expected = [float(sum(groups.group_of(d))) for d in range(8)]
    assert run_all_reduce_of_device_ids(text) == expected
    assert sorted(d for g in groups.groups for d in g) == list(range(8))


@pytest.mark.parametrize("text", ["mesh['x'=2,'y'=4] {'y','x'}", "mesh['x'=2,'y'=4] {'x','y'}",
                                  "mesh['x'=2,'y'=2,'z'=2] {'z','x'}", "[2,4]<=[2,4]T(1,0)"])
def test_group_order_is_the_order_xla_gathers_in(text):
    """Within a group the order matters (all-gather concatenates in it): in the mesh form it
    follows the listed axes, not the mesh's order."""
    from hlo_passes.runtime import xla_backend

    groups = reader_for("replica_groups")(text)
    module = f"""HloModule m, replica_count=8
ENTRY e {{
  r = u32[] replica-id()
  b = u32[1] broadcast(r), dimensions={{}}
  ROOT g = u32[{groups.group_size}] all-gather(b), dimensions={{0}}, replica_groups={text}
}}"""
    gathered = xla_backend.compile_hlo(module, num_replicas=8).run([])
    for device in range(8):
        assert list(gathered[device][0]) == list(groups.group_of(device))


def test_mesh_groups_with_device_ids_parse_in_an_instruction_and_print_back():
    """In an instruction the `, device_ids=(...)` inside the value is not a new attribute; the
    mesh's positions hold those devices, as in a named sharding.  (XLA's partitioner prints
    this form and means that: its partition over a permuted device order verifies only read
    so, see tests/spmd/test_xla_suite_families.py.  XLA:CPU running such text itself, in jax
    0.12, groups as if the device_ids were absent.)"""
    from hlo_passes import parse_module, print_module

    text = """HloModule m, num_partitions=4
ENTRY e {
  p = f32[4,2,2] parameter(0)
  ROOT a = f32[4,2,2] all-to-all(p), channel_id=2, replica_groups=mesh['x'=1,'y'=2,'z'=2], device_ids=(3,1,2,0) {'z'}, dimensions={1}
}
"""
    module = parse_module(text)
    groups = module.entry.root.replica_groups
    assert groups.groups == ((3, 1), (2, 0))
    again = parse_module(print_module(module))
    assert again.entry.root.replica_groups == groups
    with pytest.raises(Exception, match="device_ids"):
        parse_module(text.replace("(3,1,2,0)", "(3,1,1,0)"))


# ------------------------------------------------ compact spelling of groups a pass makes --

def _mesh_groups(rng):
    """Random groupings as a partitioner makes them: the devices of a mesh (iota, maybe with
    its axes transposed) that differ only along a random subset of its axes."""
    rank = int(rng.integers(1, 5))
    dims = [int(rng.choice([1, 2, 3, 4])) for _ in range(rank)]
    perm = [int(i) for i in rng.permutation(rank)]
    mesh = np.arange(int(np.prod(dims))).reshape(dims).transpose(perm)
    varying = [a for a in range(rank) if rng.random() < 0.5]
    fixed = [a for a in range(rank) if a not in varying]
    size = int(np.prod([mesh.shape[a] for a in varying]))
    return [tuple(int(d) for d in row) for row in mesh.transpose(fixed + varying).reshape(-1, size)]


def test_groups_a_pass_makes_print_in_iota_form_and_keep_their_meaning():
    """Every mesh-axis grouping has an iota spelling; the spelling expands to exactly the groups."""
    from hlo_passes.ir.replica_groups import ReplicaGroups

    rng = np.random.default_rng(0)
    for _ in range(500):
        groups = _mesh_groups(rng)
        made = ReplicaGroups.of(groups)
        assert made.iota is not None, groups
        assert made.to_hlo().startswith("["), made
        again = reader_for("replica_groups")(made.to_hlo())
        assert again.groups == tuple(groups) and again == made


def test_groups_without_an_iota_form_stay_lists():
    from hlo_passes.ir.replica_groups import ReplicaGroups

    for groups in ([(1, 0), (2, 3)], [(0, 1, 2), (3,)], [(0, 3), (1, 2)], [(0, 2)]):
        assert ReplicaGroups.of(groups).to_hlo().startswith("{{"), groups


@pytest.mark.parametrize("seed", range(4))
def test_compact_groups_mean_what_xla_means(seed):
    """XLA runs an all-reduce over our iota spelling of random 8-device mesh groupings (axes
    transposed, some varying) and sums exactly the devices of each device's group."""
    from hlo_passes.ir.replica_groups import ReplicaGroups

    rng = np.random.default_rng(100 + seed)
    groups = _mesh_groups(rng)
    while len([d for g in groups for d in g]) != 8 or len(groups[0]) == 1:
        groups = _mesh_groups(rng)
    spelling = ReplicaGroups.of(groups).to_hlo()
    assert spelling.startswith("["), spelling
    sums = run_all_reduce_of_device_ids(spelling)
    assert sums == [float(sum(g)) for d in range(8) for g in groups if d in g]


def test_compact_groups_at_2048_devices():
    """A transposed 3-axis mesh of 2048 devices: the grouping prints in a few characters and
    XLA's parser accepts it and keeps it in that form."""
    from hlo_passes.ir.replica_groups import ReplicaGroups
    from hlo_passes.runtime import xla_backend

    mesh = np.arange(2048).reshape(8, 16, 16).transpose(2, 0, 1)
    groups = [tuple(int(d) for d in row) for row in mesh.transpose(0, 2, 1).reshape(-1, 8)]
    compact = ReplicaGroups.of(groups).to_hlo()
    assert len(compact) < 40 < len(ReplicaGroups.explicit(groups).to_hlo())
    module = f"""HloModule m, num_partitions=2048
add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}
ENTRY e {{
  p = f32[4] parameter(0)
  ROOT r = f32[4] all-reduce(p), channel_id=1, replica_groups={compact}, use_global_device_ids=true, to_apply=add
}}
"""
    assert f"replica_groups={compact}," in xla_backend.canonical_text(module)
