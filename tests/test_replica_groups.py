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
