"""Data-parallel MLP training with Adam on 8 CPU devices, with and without our passes in jax.jit.

    python examples/train_data_parallel.py [--steps 20] [--pipeline weight-update-sharding,collective-fusion]

Trains the same model twice from the same initial state: once with XLA alone, once with
the pipeline installed in XLA's compiler through `hlo_passes.jax_hook` (pre-scheduler,
numerically verified once per module).  Asserts that the losses agree step by step and
prints step time, per-device optimizer-state bytes and the collectives in the compiled
step side by side, plus what each pass did (its remarks).  Passes of the pipeline that
are not in this checkout are skipped (and said so).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from hlo_passes import jax_hook  # noqa: E402
from hlo_passes.ir.opcode import Opcode  # noqa: E402
from hlo_passes.parse.module_parser import parse_module  # noqa: E402
from hlo_passes.passes.registry import lookup  # noqa: E402

SIZES = (64, 256, 256, 10)
COLLECTIVES = (Opcode.ALL_REDUCE, Opcode.REDUCE_SCATTER, Opcode.ALL_GATHER, Opcode.ALL_REDUCE_START,
               Opcode.ALL_GATHER_START, Opcode.COLLECTIVE_PERMUTE)


def init(key):
    params = {}
    for i, (a, b) in enumerate(zip(SIZES[:-1], SIZES[1:])):
        key, sub = jax.random.split(key)
        params[f"w{i}"] = jax.random.normal(sub, (a, b)) / np.sqrt(a)
        params[f"b{i}"] = jnp.zeros(b)
    return params


def loss_fn(params, x, y):
    h = x
    n = len(SIZES) - 1
    for i in range(n):
        h = h @ params[f"w{i}"] + params[f"b{i}"]
        if i < n - 1:
            h = jax.nn.gelu(h)
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(h) * jax.nn.one_hot(y, SIZES[-1]), axis=-1))


def make_step(lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    def step(params, opt, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        t = opt["t"] + 1
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, opt["m"], grads)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, opt["v"], grads)
        scale = lr * jnp.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        params = jax.tree.map(lambda p, m, v: p - scale * m / (jnp.sqrt(v) + eps), params, m, v)
        return params, {"m": m, "v": v, "t": t}, loss

    return jax.jit(step)


def train(steps, batch_sharding):
    key = jax.random.key(0)
    params = init(key)
    opt = {"m": jax.tree.map(jnp.zeros_like, params), "v": jax.tree.map(jnp.zeros_like, params),
           "t": jnp.zeros((), jnp.int32)}
    rng = np.random.default_rng(0)
    data = [(jax.device_put(rng.normal(size=(256, SIZES[0])).astype(np.float32), batch_sharding),
             jax.device_put(rng.integers(0, SIZES[-1], 256), batch_sharding)) for _ in range(4)]
    step = make_step()
    compiled = step.lower(params, opt, *data[0]).compile()
    losses, times = [], []
    for i in range(steps):
        start = time.perf_counter()
        params, opt, loss = step(params, opt, *data[i % len(data)])
        loss.block_until_ready()
        times.append(time.perf_counter() - start)
        losses.append(float(loss))
    opt_bytes = sum(s.data.nbytes for leaf in jax.tree.leaves(opt) for s in leaf.addressable_shards
                    if s.device == jax.devices()[0])
    return losses, float(np.median(times[1:])), opt_bytes, collective_counts(compiled.as_text())


def collective_counts(text: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for instr in parse_module(text).all_instructions():
        if instr.opcode in COLLECTIVES:
            counts[instr.opcode.value] = counts.get(instr.opcode.value, 0) + 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--pipeline", default="weight-update-sharding,collective-fusion")
    args = parser.parse_args()
    wanted = [p for p in args.pipeline.split(",") if p]
    present = [p for p in wanted if lookup(p.split("{")[0]) is not None]
    missing = sorted(set(wanted) - set(present))
    pipeline = ",".join(present)
    if missing:
        print(f"not in this checkout, skipped: {', '.join(missing)}")

    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    batch = NamedSharding(mesh, P("data"))
    base = train(args.steps, batch)
    with jax_hook.installed(pipeline, verify=True) as hook:
        ours = train(args.steps, batch)

    np.testing.assert_allclose(ours[0], base[0], rtol=1e-4, atol=1e-6)
    print(f"losses agree over {args.steps} steps (first {base[0][0]:.4f}, last {base[0][-1]:.4f})")
    print(f"{'':34}{'XLA':>16}{'XLA + ' + pipeline:>48}")
    print(f"{'step time (median)':34}{base[1] * 1e3:>14.2f}ms{ours[1] * 1e3:>46.2f}ms")
    print(f"{'optimizer state bytes / device':34}{base[2]:>16,}{ours[2]:>48,}")
    for op in sorted(set(base[3]) | set(ours[3])):
        print(f"{op + ' in compiled step':34}{base[3].get(op, 0):>16}{ours[3].get(op, 0):>48}")
    print(f"hook: {hook.stats}")
    for record in hook.stats.records:
        if record.name == "jit_step":
            print(f"  {record}")
    print(f"remarks ({len(hook.stats.remarks)}):")
    for remark in hook.stats.remarks[:15]:
        print(f"  {remark.format()}")


if __name__ == "__main__":
    main()
