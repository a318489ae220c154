"""A side-effecting op placed on one device (`{maximal device=N}`, as JAX places a host
callback) runs on that device only: inside a conditional on `partition-id == N`, its result
broadcast from N.  It ran on every device (once per device: eight callbacks for one)."""

from __future__ import annotations

import pytest

from hlo_passes import parse_module
from hlo_passes.runtime.xla_backend import parse_with_xla
from tests.spmd.partitioning import collectives, partition

_EFFECT = """HloModule effect, num_partitions=8
ENTRY e {{
  x = f32[16,8] parameter(0), sharding={{devices=[8,1]<=[8]}}
  c = f32[16,8] custom-call(x), custom_call_target="host_effect", custom_call_has_side_effect=true, sharding={{maximal device={device}}}
  ROOT y = f32[16,8] add(c, x), sharding={{devices=[8,1]<=[8]}}
}}
"""

_ORDERED = """HloModule ordered_effect, num_partitions=8
ENTRY e {
  t = token[] parameter(0)
  x = f32[16,8] parameter(1), sharding={devices=[8,1]<=[8]}
  c = (token[], f32[16,8]) custom-call(t, x), custom_call_target="host_effect", custom_call_has_side_effect=true, sharding={{maximal device=2}, {maximal device=2}}
  v = f32[16,8] get-tuple-element(c), index=1
  u = token[] get-tuple-element(c), index=0
  y = f32[16,8] add(v, x), sharding={devices=[8,1]<=[8]}
  ROOT r = (token[], f32[16,8]) tuple(u, y), sharding={{replicated}, {devices=[8,1]<=[8]}}
}
"""


def _effect_placement(module):
    """(the computations holding the effect, the conditional that runs it)."""
    holders = [c for c in module.computations
               if any(i.custom_call_target == "host_effect" for i in c.instructions)]
    conds = [i for i in module.all_instructions() if i.opcode.value == "conditional"]
    return holders, conds


@pytest.mark.parametrize("device", [0, 5])
def test_a_side_effect_on_one_device_runs_there_only(device):
    module, out, _ = partition(_EFFECT.format(device=device))
    holders, conds = _effect_placement(module)
    assert len(holders) == 1 and holders[0] is not module.entry, out
    cond, = conds
    assert cond.called["true_computation"] is holders[0], out
    pred = cond.operands[0]
    assert pred.opcode.value == "compare" and pred.operands[0].opcode.value == "partition-id", out
    assert pred.operands[1].literal == str(device), out
    assert collectives(module) == {"all-gather": 1, "all-reduce": 1}, out
    parse_with_xla(out)


def test_an_ordered_effect_keeps_its_token_and_broadcasts_its_value():
    module, out, _ = partition(_ORDERED)
    holders, conds = _effect_placement(module)
    assert len(holders) == 1 and holders[0] is not module.entry and len(conds) == 1, out
    elsewhere = conds[0].called["false_computation"]
    assert any(i.opcode.value == "after-all" for i in elsewhere.instructions), out
    assert collectives(module) == {"all-gather": 1, "all-reduce": 1}, out
    parse_with_xla(out)


def test_a_maximal_op_without_side_effects_is_still_computed_everywhere():
    """No effect to repeat: computing it on every device costs no collective."""
    text = _EFFECT.format(device=3).replace(", custom_call_has_side_effect=true", "").replace(
        'custom-call(x), custom_call_target="host_effect"', "negate(x)")
    module, out, _ = partition(text)
    assert not [i for i in module.all_instructions() if i.opcode.value == "conditional"], out
    assert parse_module(out) is not None
