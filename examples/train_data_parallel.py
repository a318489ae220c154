"""Data-parallel MLP training with Adam on 8 CPU devices, with and without our passes in jax.jit.

    python examples/train_data_parallel.py [--steps 20] [--width 512] [--batch 128]
        [--pipeline weight-update-sharding{cost-profile=cpu},collective-fusion] [--stage pre-scheduler]

Trains the same model twice from the same initial state: once with XLA alone, once with
the pipeline installed in XLA's compiler through `hlo_passes.jax_hook` (numerically
verified once per module).  Asserts that the losses agree step by step and prints, side by
side: per-device FLOPs of the compiled step (XLA's cost analysis), its collectives by kind
(count and bytes each device sends into them), the median step time and the per-device
optimizer-state bytes, plus what each pass did (its remarks).  Passes of the pipeline that
are not in this checkout are skipped (and said so).

Optimizer-state bytes cannot shrink through the hook: JAX fixes the compiled function's
parameter and output shapes, so weight-update sharding shards the update's compute and
all-gathers the new weights and Adam moments inside the step.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass, field

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from hlo_passes import jax_hook  # noqa: E402
from hlo_passes.parse.module_parser import parse_module  # noqa: E402
from hlo_passes.passes.registry import lookup  # noqa: E402
from hlo_passes.stats import module_stats  # noqa: E402

SIZES = [64, 1024, 1024, 10]  # input, hidden, hidden, classes; --width sets the hidden ones


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


@dataclass
class Run:
    """One compiled step and the training run made with it."""

    step: object  # jax.stages.Compiled
    state: tuple  # (params, opt)
    losses: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)

    @property
    def step_ms(self) -> float:
        return float(np.median(self.times[1:])) * 1e3

    @property
    def opt_bytes(self) -> int:
        """Optimizer state held by device 0."""
        return sum(s.data.nbytes for leaf in jax.tree.leaves(self.state[1]) for s in leaf.addressable_shards
                   if s.device == jax.devices()[0])

    @property
    def flops(self) -> float:
        """Per-device FLOPs of the compiled step, from XLA's cost analysis."""
        cost = self.step.cost_analysis()
        return float((cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"])

    @property
    def collectives(self) -> dict[str, tuple[int, int]]:
        """kind -> (count, bytes each device sends into them) in the compiled step."""
        stats = module_stats(parse_module(self.step.as_text()))
        return {k: (n, stats.collective_bytes[k]) for k, n in stats.collective_count.items()}


def initial_state():
    params = init(jax.random.key(0))
    opt = {"m": jax.tree.map(jnp.zeros_like, params), "v": jax.tree.map(jnp.zeros_like, params),
           "t": jnp.zeros((), jnp.int32)}
    return params, opt


def batches(batch: int, batch_sharding, count: int = 4):
    rng = np.random.default_rng(0)
    return [(jax.device_put(rng.normal(size=(batch, SIZES[0])).astype(np.float32), batch_sharding),
             jax.device_put(rng.integers(0, SIZES[-1], batch), batch_sharding)) for _ in range(count)]


def compile_step(data) -> Run:
    """Compile the step (under whatever hook is installed) for the initial state."""
    params, opt = initial_state()
    return Run(make_step().lower(params, opt, *data[0]).compile(), (params, opt))


def train(runs: list[Run], data, steps: int) -> None:
    """Advance every run by `steps`, interleaved step by step so that they share the machine's load."""
    for i in range(steps):
        for run in runs:
            start = time.perf_counter()
            params, opt, loss = run.step(*run.state, *data[i % len(data)])
            loss.block_until_ready()
            run.times.append(time.perf_counter() - start)
            run.losses.append(float(loss))
            run.state = (params, opt)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=SIZES[1], help="hidden layer width")
    parser.add_argument("--batch", type=int, default=128, help="global batch (split over 8 devices)")
    parser.add_argument("--pipeline", default="weight-update-sharding{cost-profile=cpu},collective-fusion")
    parser.add_argument("--stage", default="pre-scheduler", choices=jax_hook.STAGES)
    args = parser.parse_args()
    SIZES[1] = SIZES[2] = args.width
    wanted = [p for p in args.pipeline.split(",") if p]
    present = [p for p in wanted if lookup(p.split("{")[0]) is not None]
    missing = sorted(set(wanted) - set(present))
    pipeline = ",".join(present)
    if missing:
        print(f"not in this checkout, skipped: {', '.join(missing)}")

    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    batch = NamedSharding(mesh, P("data"))
    data = batches(args.batch, batch)
    base = compile_step(data)
    with jax_hook.installed(pipeline, stage=args.stage, verify=True) as hook:
        ours = compile_step(data)
    train([base, ours], data, args.steps)

    np.testing.assert_allclose(ours.losses, base.losses, rtol=1e-4, atol=1e-6)
    print(f"MLP {'-'.join(map(str, SIZES))}, Adam, global batch {args.batch} over 8 CPU devices, "
          f"{args.steps} steps at {args.stage}")
    print(f"losses agree step by step (first {base.losses[0]:.4f}, last {base.losses[-1]:.4f})")
    right = f"XLA + {pipeline}"
    print(f"{'':34}{'XLA':>16}  {right}")
    print(f"{'FLOPs / device (cost analysis)':34}{base.flops:>16,.0f}  {ours.flops:,.0f} "
          f"({ours.flops / base.flops - 1:+.1%})")
    for kind in sorted(set(base.collectives) | set(ours.collectives)):
        (bn, bb), (on, ob) = base.collectives.get(kind, (0, 0)), ours.collectives.get(kind, (0, 0))
        print(f"{kind + ' (count, bytes sent)':34}{f'{bn} × {bb:,}':>16}  {on} × {ob:,}")
    print(f"{'step time (median)':34}{base.step_ms:>14.2f}ms  {ours.step_ms:.2f}ms "
          f"({ours.step_ms / base.step_ms:.2f}×)")
    print(f"{'optimizer state bytes / device':34}{base.opt_bytes:>16,}  {ours.opt_bytes:,} "
          "(fixed by JAX's signature)")
    print(f"hook: {hook.stats}")
    for record in hook.stats.records:
        if record.name == "jit_step":
            print(f"  {record}")
    print(f"remarks ({len(hook.stats.remarks)}):")
    for remark in hook.stats.remarks[:15]:
        print(f"  {remark.format()}")


if __name__ == "__main__":
    main()
