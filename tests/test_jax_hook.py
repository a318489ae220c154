"""jax_hook: our pipelines inside real jax.jit compilation on 8 CPU devices.

Guards: install/uninstall really (un)register the callback; modules XLA hands over at
either stage survive parse -> print -> XLA's parser bit for bit; every way a rewrite can
go wrong (a pass raising, output XLA's parser rejects, output that computes something
else, a changed entry signature) falls back to XLA's module with a warning naming the
pass; a data-parallel training run gives the same losses with the collective passes
installed; weight-update-sharding really rewrites XLA's fused Adam and clipped steps into
reduce-scatters and all-gathers with the same results, and declines scheduled modules.
"""

import warnings

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from hlo_passes import jax_hook
from hlo_passes.ir.opcode import Opcode
from hlo_passes.passes import registry
from hlo_passes.passes.pass_base import ModulePass


# ------------------------------------------------------------ test passes --
class Touch(ModulePass):
    """Changes nothing but says it did: forces print -> XLA parse -> hand back."""
    name = "test-touch"
    summary = "claim a change"
    runs = 0

    def run(self, module):
        Touch.runs += 1
        return True


class SubtractToAdd(ModulePass):
    """Valid HLO that computes something else: every subtract becomes an add."""
    name = "test-subtract-to-add"
    summary = "corrupt numerics"

    def run(self, module):
        changed = False
        for instr in module.all_instructions():
            if instr.opcode is Opcode.SUBTRACT:
                instr.opcode = Opcode.ADD
                changed = True
        return changed


class Raises(ModulePass):
    name = "test-raises"
    summary = "a pass with a bug"

    def run(self, module):
        raise RuntimeError("bug in pass")


class BadOperandCount(ModulePass):
    """Output XLA's parser rejects: a unary instruction turned into an add with one operand."""
    name = "test-bad-hlo"
    summary = "corrupt structure"

    def run(self, module):
        for instr in module.all_instructions():
            if len(instr.operands) == 1 and not instr.shape.is_tuple and not instr.called:
                instr.opcode = Opcode.ADD
                instr.attributes.clear()
                return True
        return False


class ImplicitBroadcast(ModulePass):
    """Output XLA's parser accepts but XLA's verifier rejects: add(f32[16,32], f32[])."""
    name = "test-implicit-broadcast"
    summary = "corrupt shapes"

    def run(self, module):
        for instr in module.all_instructions():
            if instr.opcode is Opcode.BROADCAST and instr.operands and not instr.operands[0].shape.dims:
                instr.opcode = Opcode.ADD
                instr.attributes.clear()
                instr.append_operand(instr.operands[0])
                return True
        return False


@pytest.fixture(autouse=True)
def test_passes(monkeypatch):
    for cls in (Touch, SubtractToAdd, Raises, BadOperandCount, ImplicitBroadcast):
        monkeypatch.setitem(registry._REGISTRY, cls.name, cls)


# --------------------------------------------------------------- programs --
def mesh():
    return Mesh(np.array(jax.devices()[:8]), ("d",))


def mlp_problem(seed=0):
    k1, k2, k3, k4 = jax.random.split(jax.random.key(seed), 4)
    params = {"w1": jax.random.normal(k1, (16, 32)) * 0.3, "b1": jnp.zeros(32),
              "w2": jax.random.normal(k2, (32, 4)) * 0.3}
    batch = NamedSharding(mesh(), P("d"))
    x = jax.device_put(jax.random.normal(k3, (64, 16)), batch)
    y = jax.device_put(jax.random.normal(k4, (64, 4)), batch)
    return params, x, y


def loss_fn(p, x, y):
    h = jnp.tanh(x @ p["w1"] + p["b1"])
    return jnp.mean((h @ p["w2"] - y) ** 2)


def make_train_step():
    @jax.jit
    def step(p, m, x, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        m = jax.tree.map(lambda mi, gi: 0.9 * mi + gi, m, g)
        return jax.tree.map(lambda pi, mi: pi - 0.05 * mi, p, m), m, loss

    return step


def train(steps=3):
    params, x, y = mlp_problem()
    momentum = jax.tree.map(jnp.zeros_like, params)
    step = make_train_step()
    losses = []
    for _ in range(steps):
        params, momentum, loss = step(params, momentum, x, y)
        losses.append(float(loss))
    return losses, jax.tree.map(np.asarray, params)


def while_loop(a):
    return jax.lax.while_loop(lambda c: c[0] < 7, lambda c: (c[0] + 1, jnp.sin(c[1]) * 1.1 + c[1].sum()),
                              (0, a))[1]


def conv(img, kernel):
    return jax.lax.conv_general_dilated(img, kernel, (1, 1), "SAME")


def run_programs():
    losses, params = train(2)
    w = jax.jit(while_loop)(jnp.arange(8.0))
    c = jax.jit(conv)(jnp.linspace(0, 1, 2 * 3 * 8 * 8).reshape(2, 3, 8, 8), jnp.ones((4, 3, 3, 3)))
    return [np.asarray(losses), *params.values(), np.asarray(w), np.asarray(c)]


# ------------------------------------------------------------------ tests --
def test_install_runs_pass_and_uninstall_stops_it():
    Touch.runs = 0
    hook = jax_hook.install("test-touch")
    try:
        assert hook.installed
        jax.jit(lambda a: a * 3 + 1)(jnp.ones(4)).block_until_ready()
        assert Touch.runs >= 1 and hook.stats.modules_changed >= 1
    finally:
        hook.uninstall()
    assert not hook.installed
    seen, runs = hook.stats.modules_seen, Touch.runs
    jax.jit(lambda a: a * 5 - 2)(jnp.ones(4)).block_until_ready()
    assert (hook.stats.modules_seen, Touch.runs) == (seen, runs)
    hook.uninstall()  # twice is fine


def test_context_manager_uninstalls_on_error():
    with pytest.raises(ZeroDivisionError):
        with jax_hook.installed("test-touch") as hook:
            1 / 0
    assert not hook.installed


def test_unknown_pass_rejected_before_registration():
    with pytest.raises(Exception, match="no-such-pass"):
        jax_hook.install("no-such-pass")


@pytest.mark.parametrize("stage", jax_hook.STAGES)
def test_round_trip_of_real_modules_is_exact(stage, tmp_path):
    expected = run_programs()
    with jax_hook.installed("test-touch", stage=stage, dump_dir=tmp_path) as hook:
        actual = run_programs()
    names = {r.name for r in hook.stats.records if r.changed}
    assert {"jit_step", "jit_while_loop", "jit_conv"} <= names
    assert hook.stats.fallbacks == 0
    for want, got in zip(expected, actual):
        np.testing.assert_array_equal(got, want)  # bit for bit
    step_dump = (tmp_path / next(p.name for p in tmp_path.iterdir() if "jit_step.before" in p.name)).read_text()
    assert "all-reduce(" in step_dump and "fusion(" in step_dump and "main.0_spmd" in step_dump
    if stage == "post-scheduler":
        assert "is_scheduled=true" in step_dump


def test_device_assignment_read_from_proto():
    seen = {}

    def grab(proto):
        from hlo_passes.runtime.hlo_proto import proto_to_text, parameter_replicated

        name = proto_to_text(proto).split(",")[0].split()[-1]
        seen[name] = (jax_hook.device_assignment(proto), parameter_replicated(proto))
        return None

    from jax.extend import xla as jex

    jex.register_hlo_module_transformation(grab, name="test.grab", platforms=["cpu"])
    try:
        jax.clear_caches()
        train(1)
    finally:
        jex.clear_hlo_module_transformation("test.grab", jex.PipelineStage.PRE_SCHEDULER, ["cpu"])
    (counts, replicated) = seen["jit_step"]
    assert counts == (1, 8)
    # params (3) and momentum (3) replicated, x and y sharded over the batch
    assert replicated == [True] * 6 + [False, False]


def test_numeric_mismatch_falls_back_naming_the_pass():
    expected, _ = train(2)
    with pytest.warns(jax_hook.HookFallback, match="test-subtract-to-add"):
        with jax_hook.installed("test-touch,test-subtract-to-add", verify=True) as hook:
            actual, _ = train(2)
    np.testing.assert_array_equal(actual, expected)
    step = [r for r in hook.stats.records if r.name == "jit_step"]
    assert step and all(not r.changed and "test-subtract-to-add" in r.fallback for r in step)


def test_without_verify_the_corrupt_rewrite_is_used():
    """Guards the test above: the corruption is real, and only verification catches it."""
    expected, _ = train(2)
    with jax_hook.installed("test-subtract-to-add", verify=False):
        actual, _ = train(2)
    assert not np.allclose(actual, expected)


@pytest.mark.parametrize("pipeline, reason", [("test-raises", "bug in pass"),
                                              ("test-bad-hlo", "(structural verifier|XLA's parser) rejects")])
def test_broken_pass_falls_back(pipeline, reason, tmp_path):
    expected, _ = train(2)
    with pytest.warns(jax_hook.HookFallback, match=f"pass '{pipeline}'.*{reason}"):
        with jax_hook.installed(pipeline, dump_dir=tmp_path) as hook:
            actual, _ = train(2)
    np.testing.assert_array_equal(actual, expected)
    assert hook.stats.fallbacks >= 1 and hook.stats.modules_changed == 0
    assert any(p.name.endswith(".fallback.txt") for p in tmp_path.iterdir())


def test_rewrite_xla_cannot_compile_is_caught_by_verify():
    expected, _ = train(2)
    with pytest.warns(jax_hook.HookFallback, match="test-implicit-broadcast.*(structural verifier rejects|cannot compile)"):
        with jax_hook.installed("test-implicit-broadcast", verify=True):
            actual, _ = train(2)
    np.testing.assert_array_equal(actual, expected)


def test_warnings_as_errors_never_reach_xla():
    expected, _ = train(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with jax_hook.installed("test-raises") as hook:
            actual, _ = train(1)
    assert actual == expected and hook.stats.fallbacks >= 1


def test_training_with_collective_passes_matches():
    pipeline = ",".join(n for n in ("weight-update-sharding", "collective-fusion") if registry.lookup(n))
    expected_losses, expected_params = train(3)
    with jax_hook.installed(pipeline, verify=True) as hook:
        losses, params = train(3)
    assert hook.stats.fallbacks == 0, [r.fallback for r in hook.stats.records if r.fallback]
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
    for name in expected_params:
        np.testing.assert_allclose(params[name], expected_params[name], rtol=1e-5, atol=1e-6)


# ------------------------------------------------- weight-update sharding --
def adam_problem():
    """A data-parallel Adam step on a 16-32-4 MLP (transposed weight gradients, a bias of 32)."""
    params, x, y = mlp_problem()
    zeros = jax.tree.map(jnp.zeros_like, params)
    return params, {"m": zeros, "v": zeros, "t": jnp.zeros((), jnp.int32)}, x, y


def make_adam_step(lr=1e-2, b1=0.9, b2=0.999, eps=1e-8):
    @jax.jit
    def step(p, opt, x, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        t = opt["t"] + 1
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, opt["m"], g)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, opt["v"], g)
        scale = lr * jnp.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        p = jax.tree.map(lambda p, m, v: p - scale * m / (jnp.sqrt(v) + eps), p, m, v)
        return p, {"m": m, "v": v, "t": t}, loss

    return step


def adam_train(steps=3):
    """(losses, final params and moments, the compiled step's HLO text) under whatever hook is installed."""
    params, opt, x, y = adam_problem()
    step = make_adam_step().lower(params, opt, x, y).compile()
    losses = []
    for _ in range(steps):
        params, opt, loss = step(params, opt, x, y)
        losses.append(float(loss))
    leaves = [np.asarray(a) for a in jax.tree.leaves((params, opt["m"], opt["v"]))]
    return losses, leaves, step.as_text()


def collectives(text):
    from hlo_passes.parse.module_parser import parse_module

    found = {}
    for instr in parse_module(text).all_instructions():
        if instr.opcode in (Opcode.ALL_REDUCE, Opcode.REDUCE_SCATTER, Opcode.ALL_GATHER):
            found.setdefault(instr.opcode, []).append(instr)
    return found


def test_weight_update_sharding_rewrites_a_jitted_adam_step():
    """XLA's one variadic gradient all-reduce and its fused Adam update become reduce-scatters,
    [chunk]-sized update fusions and all-gathers in the executable jax.jit runs; every step's
    loss and every weight and moment agree with XLA's own executable.  (Forced: jax.jit returns
    both moments whole, so the priced default declines, see below.)"""
    expected_losses, expected, xla_text = adam_train()
    before = collectives(xla_text)
    assert Opcode.REDUCE_SCATTER not in before and any(i.shape.is_tuple for i in before[Opcode.ALL_REDUCE])
    with jax_hook.installed("weight-update-sharding{only-when-it-pays=false}", verify=True) as hook:
        losses, actual, text = adam_train()
    assert hook.stats.fallbacks == 0, [r.fallback for r in hook.stats.records if r.fallback]
    step = [r for r in hook.stats.records if r.name == "jit_step"]
    assert step and all(r.changed and r.verified for r in step)
    applied = [r for r in hook.stats.remarks if r.kind == "applied"]
    assert len(applied) == 3, [r.format() for r in hook.stats.remarks]  # w1, b1, w2
    after = collectives(text)
    # the pass packs its small tensors: one reduce-scatter of the 3 gradients, one variadic
    # all-gather of w, m and v for each of the 3 weights
    (rs,) = after[Opcode.REDUCE_SCATTER]
    (ag,) = after[Opcode.ALL_GATHER]
    assert ag.shape.is_tuple and len(ag.shape.elements) == 9
    # only the loss is still all-reduced
    assert all(i.shape.is_array and i.shape.rank == 0 for i in after[Opcode.ALL_REDUCE])
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
    for got, want in zip(actual, expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_weight_update_sharding_declines_a_jitted_adam_step_by_price():
    """With default options the pass prices the same rewrite: jax.jit returns m and v whole, so
    each weight would cost two more all-gathers, more than the 7/8 of the fused update they save.
    XLA's executable runs unchanged and the remarks give both estimates."""
    expected_losses, _, _ = adam_train(2)
    with jax_hook.installed("weight-update-sharding", verify=True) as hook:
        losses, _, text = adam_train(2)
    assert hook.stats.fallbacks == 0 and hook.stats.modules_changed == 0
    missed = [r for r in hook.stats.remarks if r.kind == "missed" and "costs more than it saves" in r.message]
    assert len(missed) == 3, [r.format() for r in hook.stats.remarks]  # w1, b1, w2
    assert all("2 optimizer-state output(s) all-gathered" in r.message and "without" in r.message for r in missed)
    assert Opcode.REDUCE_SCATTER not in collectives(text)
    assert losses == expected_losses


def test_weight_update_sharding_with_collective_fusion_combines_the_new_collectives():
    expected_losses, _, _ = adam_train(2)
    pipeline = "weight-update-sharding{only-when-it-pays=false},collective-fusion"
    with jax_hook.installed(pipeline, verify=True) as hook:
        losses, _, text = adam_train(2)
    assert hook.stats.fallbacks == 0, [r.fallback for r in hook.stats.records if r.fallback]
    after = collectives(text)
    assert len(after[Opcode.REDUCE_SCATTER]) == 1 and len(after[Opcode.ALL_GATHER]) == 1
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)


def test_a_wrong_pass_after_weight_update_sharding_still_falls_back():
    """The fallback path with a real rewrite in front: the culprit is found by re-running the
    pipeline pass by pass (weight-update-sharding verifies, the corrupting pass does not)."""
    expected_losses, expected, _ = adam_train(2)
    with pytest.warns(jax_hook.HookFallback, match="pass 'test-subtract-to-add'"):
        pipeline = "weight-update-sharding{only-when-it-pays=false},test-subtract-to-add"
        with jax_hook.installed(pipeline, verify=True) as hook:
            losses, actual, text = adam_train(2)
    assert Opcode.REDUCE_SCATTER not in collectives(text)  # XLA's own module ran
    assert losses == expected_losses
    for got, want in zip(actual, expected):
        np.testing.assert_array_equal(got, want)
    assert hook.stats.modules_changed == 0 and hook.stats.fallbacks >= 1


def test_weight_update_sharding_declines_scheduled_modules():
    expected_losses, _, _ = adam_train(2)
    with jax_hook.installed("weight-update-sharding", stage="post-scheduler") as hook:
        losses, _, text = adam_train(2)
    assert hook.stats.modules_changed == 0 and hook.stats.fallbacks == 0
    assert any("already scheduled" in r.message for r in hook.stats.remarks)
    assert Opcode.REDUCE_SCATTER not in collectives(text)
    assert losses == expected_losses


def clipped_step(p, opt, x, y):
    """Momentum with global-norm clipping: XLA fuses the norm of all gradients into one scalar
    fusion and applies the clip factor inside the moment fusions before their transposes."""
    loss, g = jax.value_and_grad(loss_fn)(p, x, y)
    norm = jnp.sqrt(sum(jnp.sum(a * a) for a in jax.tree.leaves(g)))
    g = jax.tree.map(lambda a: a * jnp.minimum(1.0, 1.0 / norm), g)
    m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, opt["m"], g)
    return jax.tree.map(lambda p, m: p - 0.01 * m, p, m), {**opt, "m": m}, loss


def test_weight_update_sharding_shards_a_fused_global_norm_clip():
    def run():
        params, opt, x, y = adam_problem()
        step = jax.jit(clipped_step).lower(params, opt, x, y).compile()
        losses = []
        for _ in range(3):
            params, opt, loss = step(params, opt, x, y)
            losses.append(float(loss))
        return losses, [np.asarray(a) for a in jax.tree.leaves((params, opt["m"]))], step.as_text()

    expected_losses, expected, _ = run()
    # forced: the momentum comes back whole, so the priced default declines
    with jax_hook.installed("weight-update-sharding{only-when-it-pays=false}", verify=True) as hook:
        losses, actual, text = run()
    assert hook.stats.fallbacks == 0, [r.fallback for r in hook.stats.records if r.fallback]
    assert len([r for r in hook.stats.remarks if r.kind == "applied"]) == 3
    after = collectives(text)
    assert len(after[Opcode.REDUCE_SCATTER]) == 1  # the 3 gradients, packed by the pass
    # the loss and the partial sums of squares are still all-reduced: scalars only
    assert all(i.shape.is_tuple or i.shape.rank == 0 for i in after[Opcode.ALL_REDUCE])
    assert all(all(e.rank == 0 for e in i.shape.elements) for i in after[Opcode.ALL_REDUCE] if i.shape.is_tuple)
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
    for got, want in zip(actual, expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_rewrite_that_changes_the_entry_signature_falls_back():
    """keep-state-sharded makes the optimizer state parameters per-device tiles: JAX would still
    pass whole moments, so the hook refuses the rewrite even without verify=True."""
    expected_losses, _, _ = adam_train(2)
    with pytest.warns(jax_hook.HookFallback, match="weight-update-sharding.*entry computation's parameter"):
        with jax_hook.installed("weight-update-sharding{keep-state-sharded=true}") as hook:
            losses, _, text = adam_train(2)
    assert hook.stats.modules_changed == 0 and Opcode.REDUCE_SCATTER not in collectives(text)
    assert losses == expected_losses


# ------------------------------------------------- buffers after copy insertion --
def loops_in_a_row(x, n):
    """Three loops whose counters XLA's copy insertion gave buffers of their own (copies of
    one constant 0): merged, the second loop starts where the first ended."""
    c, _ = jax.lax.scan(lambda c, xi: (c + xi, None), jnp.zeros(x.shape[1:]), x)
    v = jax.lax.fori_loop(0, 5, lambda i, v: v + c, c)
    return jax.lax.while_loop(lambda s: s[0] < n, lambda s: (s[0] + 1, s[1] * 2), (0, v))[1]


def two_draws(key):
    return jax.random.uniform(key, (4,)) + jax.random.normal(jax.random.fold_in(key, 3), (4,))


def updates_of_one_array(x, idx, v):
    return x.at[idx].set(v), x.at[idx].add(v)


@pytest.mark.parametrize("stage", jax_hook.STAGES)
def test_cse_keeps_buffers_copy_insertion_kept_apart(stage):
    """Both hook stages come after XLA's copy insertion: cse must not merge the copies that
    give each loop counter, each in-place scatter and each output a buffer of its own (merged,
    the results were wrong, or XLA aborted on two outputs sharing one buffer)."""
    cases = [(loops_in_a_row, (np.ones((6, 2), np.float32), 1)),
             (two_draws, (jax.random.key(0),)),
             (updates_of_one_array, (np.arange(12, dtype=np.float32).reshape(6, 2), np.array([1, 4]),
                                     np.ones((2, 2), np.float32))),
             (lambda e: (e * 2, e + 1), (np.zeros((0,), np.float32),))]
    for fn, args in cases:
        expected = jax.jit(fn)(*args)
        with jax_hook.installed("cse", stage=stage, verify=True) as hook:
            actual = jax.jit(fn)(*args)
        for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
            np.testing.assert_array_equal(np.asarray(a) if a.dtype != jax.random.key(0).dtype
                                          else jax.random.key_data(a), np.asarray(e) if e.dtype != jax.random.key(0).dtype
                                          else jax.random.key_data(e))
        assert hook.stats.fallbacks == 0


class CseWithoutBufferCare(ModulePass):
    """cse as it was: merges copies and in-place operands (what the safety net must catch)."""
    name = "test-cse-ignoring-buffers"
    summary = "merge everything equal"

    def run(self, module):
        from hlo_passes.passes.cleanup.cse import CommonSubexpressionElimination
        module.copies_inserted = False
        try:
            return CommonSubexpressionElimination().run(module)
        finally:
            module.copies_inserted = True


def test_a_pass_that_shares_an_in_place_buffer_falls_back(monkeypatch):
    """The hook's own check (ir/buffers.py), which the numeric check cannot replace: it
    compiles both modules from the start, copy insertion included, and found them equal."""
    monkeypatch.setitem(registry._REGISTRY, CseWithoutBufferCare.name, CseWithoutBufferCare)
    args = (np.ones((6, 2), np.float32), 1)
    expected = jax.jit(loops_in_a_row)(*args)
    with pytest.warns(jax_hook.HookFallback, match="test-cse-ignoring-buffers.*shares a buffer XLA's copy insertion"):
        with jax_hook.installed("test-cse-ignoring-buffers", verify=True) as hook:
            actual = jax.jit(loops_in_a_row)(*args)
    np.testing.assert_array_equal(actual, expected)
    assert hook.stats.fallbacks == 1 and hook.stats.modules_changed == 0


def psum_of_shards(x):
    return jax.shard_map(lambda b: jax.lax.psum(b, "d"), mesh=mesh(), in_specs=P("d"), out_specs=P())(x)


def shard_plus_device_count(x):
    return jax.shard_map(lambda b: b + jax.lax.psum(jnp.ones(()), "d"), mesh=mesh(), in_specs=P("d"),
                         out_specs=P("d"))(x)


@pytest.mark.parametrize("fn, pipeline, stage, reason", [
    (psum_of_shards, "collective-fusion{make-async=true}", "pre-scheduler", "asynchronous|shares a buffer"),
    (shard_plus_device_count, "collective-fusion", "post-scheduler", "no standalone"),
])
def test_what_xla_cpu_cannot_compile_at_the_stage_falls_back(fn, pipeline, stage, reason):
    """Start/done pairs (XLA:CPU's thunk emitter takes only synchronous collectives) and, after
    scheduling, an op left outside a fusion (a psum of ones folded into a broadcast) failed the
    jit itself; verification compiles both modules from the start, so it passed them."""
    x = np.arange(16, dtype=np.float32)
    expected = jax.jit(fn)(x)
    with pytest.warns(jax_hook.HookFallback, match=f"collective-fusion.*({reason})"):
        with jax_hook.installed(pipeline, stage=stage, verify=True) as hook:
            actual = jax.jit(fn)(x)
    np.testing.assert_array_equal(actual, expected)
    assert hook.stats.modules_changed == 0
