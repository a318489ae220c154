"""weight-update-sharding on real Optax steps (programs/, written by make_programs.py), through the
plain pipeline `spmd-partition,weight-update-sharding`: with default options (priced, packed) and
with the state kept sharded.  Every rewrite is checked against XLA's run of the unpartitioned step
on 8 devices (the oracle); the remarks say what was sharded and why the rest was not.
"""

from pathlib import Path

import numpy as np
import pytest

from hlo_passes import parse_module, print_module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.passes.pipeline import parse_pipeline, set_option_everywhere
from hlo_passes.runtime import verify_equivalent
from hlo_passes.runtime.verify import random_inputs
from hlo_passes.passes.spmd.cost_model import module_estimate
from hlo_passes.stats import module_stats

PROGRAMS = Path(__file__).parent / "programs"
N = 8
# Every update elementwise but for whole-tensor reductions (clipping's global norm, LAMB's norms).
OPTIMIZERS = ["momentum", "nesterov", "adamw_schedule_mask", "adamw_clip", "lamb_clip", "apply_every", "multisteps"]


def run(text: str, pipeline: str):
    """The partitioned module, weight-update-sharding's remarks (applied, missed)."""
    module = parse_module(text)
    passes = parse_pipeline(pipeline)
    set_option_everywhere(passes, "num_partitions", N)
    applied, missed = [], []
    for p in passes.passes:
        p.run(module)
        if p.name == "weight-update-sharding":
            applied = [r for r in p.remarks if r.kind == "applied"]
            missed = [r for r in p.remarks if r.kind == "missed"]
    return module, applied, missed


def count(module, opcode: Opcode) -> int:
    return sum(1 for i in module.all_instructions() if i.opcode is opcode)


def sent_bytes(module) -> int:
    return sum(module_stats(module).collective_bytes.values())


def wire_bytes(module) -> int:
    """The ring volume the cost model charges (an all-reduce 2(g-1)/g of its buffer, a
    reduce-scatter or all-gather (g-1)/g): a reduce-scatter + all-gather equals an all-reduce."""
    return module_estimate(module).bytes


@pytest.mark.parametrize("form", ["jit", "shard_map"])
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_plain_pipeline_with_kept_state_rewrites_optax_steps(form, optimizer):
    """With the state kept sharded every program is rewritten by the plain pipeline (LAMB's norms
    are calls: no call-inliner first), nothing declined, its small collectives packed into one
    reduce-scatter and one all-gather, and it computes what the original computes.  On the wire
    it moves what plain partitioning moves but for the padding of the small tensors and the scalar
    all-reduces of the norms (under 3% on this tiny MLP)."""
    text = (PROGRAMS / f"{form}_{optimizer}.hlo").read_text()
    plain, _, _ = run(text, "spmd-partition")
    module, applied, missed = run(text, "spmd-partition,weight-update-sharding{keep-state-sharded=true}")
    assert applied and not missed, [r.format() for r in missed]
    assert count(module, Opcode.REDUCE_SCATTER) == 1 and count(module, Opcode.ALL_GATHER) == 1
    assert wire_bytes(module) < 1.03 * wire_bytes(plain)
    report = verify_equivalent(text, print_module(module))
    assert report.ok, report.format()


@pytest.mark.parametrize("form", ["jit", "shard_map"])
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_plain_pipeline_never_moves_more_bytes_than_partitioning(form, optimizer):
    """Default options: the signature returns the optimizer state whole, so sharding an update
    costs one more all-gather per state tensor, and the update it would shard is one fused kernel
    that costs less than those gathers (accelerator profile, with or without overlap).  Every
    gradient is declined by price, the remark giving both estimates; the step moves no more wire
    bytes than plain partitioning (shard_map: fewer, its pmean of a reduced gradient simplified)
    and computes what the original computes."""
    text = (PROGRAMS / f"{form}_{optimizer}.hlo").read_text()
    plain, _, _ = run(text, "spmd-partition")
    module, applied, missed = run(text, "spmd-partition,weight-update-sharding")
    assert wire_bytes(module) <= wire_bytes(plain)
    assert count(module, Opcode.REDUCE_SCATTER) == 0
    assert len(missed) == 4  # the MLP's two weights and two biases
    for r in missed:
        assert ("costs more than it saves" in r.message and "optimizer-state output(s) all-gathered" in r.message
                and "with the rewrite" in r.message and "without" in r.message
                and "with nothing overlapped" in r.message), r.format()
    assert all("times the group size" in r.message for r in applied)  # only pmean simplifications
    report = verify_equivalent(text, print_module(module))
    assert report.ok, report.format()


@pytest.mark.parametrize("optimizer", ["momentum", "adamw_clip", "lamb_clip"])
def test_shard_map_pmean_of_a_reduced_gradient_is_not_sharded_twice(optimizer):
    """shard_map programs pmean a gradient that is already reduced: that all-reduce is the value
    times the group size, simplified first, so the pass sends fewer bytes than plain partitioning."""
    text = (PROGRAMS / f"shard_map_{optimizer}.hlo").read_text()
    plain, _, _ = run(text, "spmd-partition")
    module, _, _ = run(text, "spmd-partition,weight-update-sharding")
    assert sent_bytes(module) < sent_bytes(plain)


def test_momentum_declined_where_gathering_state_costs_more():
    """SGD-momentum under jax.jit returns its momentum whole: the priced default declines some
    updates (one more all-gather each); forced, it rewrites all four, and both verify."""
    text = (PROGRAMS / "jit_momentum.hlo").read_text()
    priced, applied, missed = run(text, "spmd-partition,weight-update-sharding")
    forced, forced_applied, forced_missed = run(
        text, "spmd-partition,weight-update-sharding{only-when-it-pays=false}")
    assert missed and len(applied) < len(forced_applied) == 4 and not forced_missed
    assert all("optimizer-state output(s) all-gathered" in r.message for r in missed)
    for module in (priced, forced):
        report = verify_equivalent(text, print_module(module))
        assert report.ok, report.format()


def _all_reduced_shapes(module) -> list[tuple[int, ...]]:
    return sorted(e.dims for i in module.all_instructions() if i.opcode is Opcode.ALL_REDUCE for e in i.shape.leaves())


@pytest.mark.parametrize("form", ["jit", "shard_map"])
@pytest.mark.parametrize("optimizer,priced", [("adafactor", 2), ("adafactor_momentum", 0)])
def test_adafactor_factored_moments_sharded_by_rows(form, optimizer, priced):
    """Adafactor factors the second moment of each weight into the means of g² over its rows and
    over its columns: reductions over one of two dimensions, not elementwise.  The update is
    tiled on dimension 0, so each device holds whole rows: the reduction over the columns stays
    on the device (a factor with its own tile of the [16] or [32] moment, all-gathered at the end
    like any state), the one over the rows is a partial sum all-reduced (a [32] or [10] vector),
    after which that factor is held whole: updated alike on every device and returned as it is,
    no all-gather.  The norms (the update's RMS clipping, the weight's RMS scale) are reduced on
    the shard.  Forced, everything is sharded; priced, the two weights are (their factored state
    costs one all-gather of 16 or 32 floats, less than the update saves, so the step moves a few
    more bytes, as the cost model allows) and the biases, whose unfactored moment comes back
    whole, are not; with momentum (a first moment of each weight's shape, returned whole) none
    is.  With the state kept sharded all four, the momentum kept as tiles beside the factors.
    Each computes what the original does."""
    text = (PROGRAMS / f"{form}_{optimizer}.hlo").read_text()
    plain, _, _ = run(text, "spmd-partition")
    for options, sharded in (("{only-when-it-pays=false}", 4), ("", priced), ("{keep-state-sharded=true}", 4)):
        module, applied, missed = run(text, f"spmd-partition,weight-update-sharding{options}")
        done = [r for r in applied if r.message.startswith("sharded")]
        assert len(done) == sharded and len(missed) == 4 - sharded, [r.format() for r in applied + missed]
        assert all("tiled on dimension 0" in r.message for r in done if "[16, 32]" in r.message or "[32, 10]" in r.message)
        assert all("optimizer-state output(s) all-gathered" in r.message for r in missed)
        if sharded:
            assert (32,) in _all_reduced_shapes(module) and (10,) in _all_reduced_shapes(module)  # column sums
            assert not any(i.opcode is Opcode.REDUCE and i.operands[0].shape.dims in ((16, 32), (32, 10))
                           for i in module.all_instructions())  # no device reduces a whole gradient or weight
        # the column sums all-reduced and the row factors all-gathered (1/16 to 1/10 of each weight)
        # add 8% to this MLP's wire bytes; forced, the biases' padding and gathered moments 4% more
        # (and the momentum, where it is returned whole, one all-gather of each weight more)
        if optimizer == "adafactor" or "keep-state" in options:
            assert wire_bytes(module) < 1.13 * wire_bytes(plain)
        if options == "{keep-state-sharded=true}" and optimizer == "adafactor_momentum":
            assert all("1 kept sharded" in r.message or "2 kept sharded" in r.message for r in done)
        report = verify_equivalent(text, print_module(module))
        assert report.ok, report.format()


@pytest.mark.parametrize("optimizer", ["momentum", "lamb_clip"])
def test_shard_map_pmean_of_a_replicated_value_is_simplified_first_never_sharded(optimizer):
    """`jax.lax.pmean(g)` inside shard_map of a gradient the loss's pmean already reduced lowers to
    an all-reduce whose operand is an all-reduce over the same devices: every device holds the
    same value, so it is that value times 8 (then divided by 8).  Forced or priced, the pass
    rewrites exactly those into multiplies (before any analysis) and shards only the first
    all-reduce of each gradient; the step still computes what it did."""
    text = (PROGRAMS / f"shard_map_{optimizer}.hlo").read_text()
    original = parse_module(text)
    twice = {i.name for i in original.all_instructions()
             if i.opcode is Opcode.ALL_REDUCE and i.operands[0].opcode is Opcode.ALL_REDUCE}
    once = {i.operands[0].name for i in original.all_instructions() if i.name in twice}
    assert len(twice) == 4
    for options in ("{only-when-it-pays=false}", ""):
        module, applied, _ = run(text, f"spmd-partition,weight-update-sharding{options}")
        simplified = {r.message.split(":")[0].lstrip("%") for r in applied if "times the group size" in r.message}
        sharded = {r.instruction for r in applied if r.message.startswith("sharded the update")}
        assert simplified == twice and not sharded & twice, [r.format() for r in applied]
        assert sharded == (once if options else set())
        assert not any(i.opcode is Opcode.ALL_REDUCE and i.name in twice for i in module.all_instructions())
        report = verify_equivalent(text, print_module(module))
        assert report.ok, report.format()


@pytest.mark.parametrize("form", ["jit", "shard_map"])
@pytest.mark.parametrize("optimizer", ["apply_every", "multisteps"])
def test_accumulating_steps_verify_on_both_branches(form, optimizer):
    """`apply_every(4)` and `MultiSteps(adam, 4)` accumulate the gradient in state and emit an
    update only when the step counter says so (`emit * acc`, `where(emit, new, old)`: elementwise
    selects on a replicated scalar).  The sharded step is checked on a step that emits (every
    counter 3) and one that does not (every counter 0), forced and with the state kept sharded."""
    text = (PROGRAMS / f"{form}_{optimizer}.hlo").read_text()
    counters = [i for i, p in enumerate(parse_module(text).entry.parameters)
                if p.shape.is_array and p.shape.rank == 0 and p.shape.element_type.value == "s32"]
    assert counters
    for options in ("{only-when-it-pays=false}", "{keep-state-sharded=true}"):
        module, applied, missed = run(text, f"spmd-partition,weight-update-sharding{options}")
        assert len([r for r in applied if r.message.startswith("sharded")]) == 4 and not missed
        for counter in (3, 0):
            inputs = random_inputs(parse_module(text), seed=counter)
            for i in counters:
                inputs[i] = np.asarray(counter, np.int32)
            report = verify_equivalent(text, print_module(module), inputs=inputs)
            assert report.ok, report.format()


@pytest.mark.parametrize("form", ["jit", "shard_map"])
def test_update_under_lax_cond_is_declined(form):
    """`MultiSteps(..., should_skip_update_fn=skip_not_finite)` runs the whole update inside a
    `conditional` (lax.cond on "are the gradients finite"): each gradient is declined, the remark
    naming the conditional, and the step is left as plain partitioning made it (shard_map: its pmean
    of a reduced gradient still simplified)."""
    text = (PROGRAMS / f"{form}_multisteps_skip.hlo").read_text()
    module, applied, missed = run(text, "spmd-partition,weight-update-sharding{only-when-it-pays=false}")
    assert len(missed) == 4 and count(module, Opcode.REDUCE_SCATTER) == 0
    assert all("to a conditional (lax.cond, lax.switch): an update under control flow is not sharded" in r.message
               and "not a weight's gradient" not in r.message for r in missed), [r.format() for r in missed]
    assert all("times the group size" in r.message for r in applied)
    report = verify_equivalent(text, print_module(module))
    assert report.ok, report.format()
