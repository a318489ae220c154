"""spmd-partition beside XLA's partitioner on generated models at realistic widths.

Each model is a JAX training step (forward, backward, SGD update) lowered for 8 devices with
`jax.jit(...).lower(ShapeDtypeStructs with shardings)` — shapes only, no parameter values, so
d_model 4096 costs nothing to build.  XLA partitions it in a compile with
`xla_dump_hlo_pass_re=spmd-partitioning` (its `after_spmd-partitioning` module is read back);
ours partitions the same lowered text.  Per model, ours beside XLA's:

    bytes      what each device sends into collectives in one step (hlo_passes.stats, a loop
               body's collectives times the loop's trip count: each collective's operands)
    wire x     ours / XLA's ring wire volume as the cost model charges it (see `measure`)
    GFLOP      XLA's HloCostAnalysis of the per-device module (the same counter for both)
    est. ms    the cost model's step time (cost_model.module_estimate, latency included,
               nothing overlapped)
    exp. ms    the time the partitioner's decisions compare (compute plus the share of
               communication and latency the profile's overlap leaves exposed); where the two
               estimates rank the plans differently (a plan with many more collectives), the
               README says so
    verified   small models only: ours against the unpartitioned program on 8 CPU devices

    .venv/bin/python benchmarks/spmd_models.py [--widths 256,1024,4096] [--profile accelerator|cpu]
        [--only gpt_tp,...] [--lowering gspmd|shardy]

The numbers move with the model, not with any parameter of ours: the widths and meshes are
the ones the issue asks about (Megatron TP + DP, FSDP, a 2-D data x model MLP).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from hlo_passes import parse_module, print_module  # noqa: E402
from hlo_passes.passes.spmd.cost_model import CostModel, module_estimate  # noqa: E402
from hlo_passes.passes.spmd.spmd_partitioner import SpmdPartitioner  # noqa: E402
from hlo_passes.runtime import verify_equivalent  # noqa: E402
from hlo_passes.runtime.lowered import with_propagation_flags  # noqa: E402
from hlo_passes.runtime.xla_backend import cost_analysis  # noqa: E402
from hlo_passes.stats import module_stats  # noqa: E402


def mesh(shape, names):
    return Mesh(np.array(jax.devices()[:math.prod(shape)]).reshape(shape), names)


def spec(m, shape, p, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(m, p))


# ----------------------------------------------------------------- models --
def gpt_tp(d: int, tokens: int = 512, heads: int = 8):
    """One GPT block (attention + MLP) step, Megatron tensor parallelism over model=4 and data
    parallelism over data=2: q/k/v and fc1 column-parallel, the output projection and fc2 row-parallel."""
    m = mesh((2, 4), ("data", "model"))
    b, s = 4, tokens // 4
    dh = d // heads

    def loss(p, x):
        q, k, v = (jnp.einsum("bsd,dhe->bhse", x, w) for w in (p["wq"], p["wk"], p["wv"]))
        a = jax.nn.softmax(jnp.einsum("bhse,bhte->bhst", q, k) / math.sqrt(dh), axis=-1)
        h = x + jnp.einsum("bhst,bhte,hed->bsd", a, v, p["wo"])
        y = h + jax.nn.gelu(h @ p["w1"]) @ p["w2"]
        return jnp.mean(y ** 2)

    def step(p, x):
        g = jax.grad(loss)(p, x)
        return jax.tree.map(lambda w, g: w - 1e-3 * g, p, g)

    params = {"wq": spec(m, (d, heads, dh), P(None, "model", None)),
              "wk": spec(m, (d, heads, dh), P(None, "model", None)),
              "wv": spec(m, (d, heads, dh), P(None, "model", None)),
              "wo": spec(m, (heads, dh, d), P("model", None, None)),
              "w1": spec(m, (d, 4 * d), P(None, "model")),
              "w2": spec(m, (4 * d, d), P("model", None))}
    return jax.jit(step), (params, spec(m, (b, s, d), P("data", None, None)))


def gpt_dense(d: int, tokens: int = 512, heads: int = 8):
    """The same block written the way Flax's Dense layers lower it: one fused qkv projection
    [d, 3d], heads split by a reshape, heads merged back by a reshape before the output Dense
    [d, d] — the sharded head dim travels through reshapes into the contracting dims."""
    m = mesh((2, 4), ("data", "model"))
    b, s = 4, tokens // 4
    dh = d // heads

    def loss(p, x):
        qkv = (x @ p["wqkv"]).reshape(b, s, 3, heads, dh)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        a = jax.nn.softmax(jnp.einsum("bshe,bthe->bhst", q, k) / math.sqrt(dh), axis=-1)
        o = jnp.einsum("bhst,bthe->bshe", a, v).reshape(b, s, d)
        h = x + o @ p["wo"]
        y = h + jax.nn.gelu(h @ p["w1"]) @ p["w2"]
        return jnp.mean(y ** 2)

    def step(p, x):
        g = jax.grad(loss)(p, x)
        return jax.tree.map(lambda w, g: w - 1e-3 * g, p, g)

    params = {"wqkv": spec(m, (d, 3 * d), P(None, "model")), "wo": spec(m, (d, d), P("model", None)),
              "w1": spec(m, (d, 4 * d), P(None, "model")), "w2": spec(m, (4 * d, d), P("model", None))}
    return jax.jit(step), (params, spec(m, (b, s, d), P("data", None, None)))


def fsdp_mlp(d: int, tokens: int = 512):
    """A 2-layer MLP step with FSDP: every weight sharded over all 8 devices, batch too."""
    m = mesh((8,), ("fsdp",))

    def step(w1, w2, x):
        g1, g2 = jax.grad(lambda w1, w2: jnp.mean(jnp.tanh(x @ w1) @ w2), argnums=(0, 1))(w1, w2)
        return w1 - 1e-3 * g1, w2 - 1e-3 * g2

    return jax.jit(step), (spec(m, (d, 4 * d), P("fsdp", None)), spec(m, (4 * d, d), P("fsdp", None)),
                           spec(m, (tokens, d), P("fsdp", None)))


def mlp_2d(d: int, tokens: int = 512):
    """An MLP step on a data=4 x model=2 mesh with the second weight sharded on both axes."""
    m = mesh((4, 2), ("data", "model"))

    def step(w1, w2, x):
        g1, g2 = jax.grad(lambda w1, w2: jnp.mean(jax.nn.relu(x @ w1) @ w2), argnums=(0, 1))(w1, w2)
        return w1 - 1e-3 * g1, w2 - 1e-3 * g2

    return jax.jit(step), (spec(m, (d, 4 * d), P(None, "model")), spec(m, (4 * d, d), P("model", "data")),
                           spec(m, (tokens, d), P("data", None)))


def gpt_scan(d: int, tokens: int = 512, heads: int = 8, layers: int = 4):
    """`layers` of gpt_tp's block as a `lax.scan` over stacked weights (how Flax's nn.scan and
    most large-model code write depth): each weight gets a leading layer dim, sharded as in
    gpt_tp on the others; the loop body slices one layer of every stack."""
    m = mesh((2, 4), ("data", "model"))
    b, s = 4, tokens // 4
    dh = d // heads

    def norm(x):  # RMS norm and 1/sqrt(d) scaling: four layers of random weights stay finite
        return x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) / math.sqrt(d)

    def block(x, p):
        y = norm(x)
        q, k, v = (jnp.einsum("bsd,dhe->bhse", y, w) for w in (p["wq"], p["wk"], p["wv"]))
        a = jax.nn.softmax(jnp.einsum("bhse,bhte->bhst", q, k) / math.sqrt(dh), axis=-1)
        h = x + jnp.einsum("bhst,bhte,hed->bsd", a, v, p["wo"])
        return h + jax.nn.gelu(norm(h) @ p["w1"]) @ p["w2"] / math.sqrt(4 * d), None

    def loss(p, x):
        y, _ = jax.lax.scan(block, x, p)
        return jnp.mean(y ** 2)

    def step(p, x):
        g = jax.grad(loss)(p, x)
        return jax.tree.map(lambda w, g: w - 1e-3 * g, p, g)

    L = layers
    params = {"wq": spec(m, (L, d, heads, dh), P(None, None, "model", None)),
              "wk": spec(m, (L, d, heads, dh), P(None, None, "model", None)),
              "wv": spec(m, (L, d, heads, dh), P(None, None, "model", None)),
              "wo": spec(m, (L, heads, dh, d), P(None, "model", None, None)),
              "w1": spec(m, (L, d, 4 * d), P(None, None, "model")),
              "w2": spec(m, (L, 4 * d, d), P(None, "model", None))}
    return jax.jit(step), (params, spec(m, (b, s, d), P("data", None, None)))


MODELS = {"gpt_tp": gpt_tp, "gpt_dense": gpt_dense, "gpt_scan": gpt_scan, "fsdp_mlp": fsdp_mlp, "mlp_2d": mlp_2d}
try:  # real Flax + Optax steps (benchmark extras: pip install flax optax)
    import flax_models

    MODELS |= {"flax_gpt_tp": lambda d: flax_models.gpt_tp(d=d),
               "flax_gpt_fsdp": lambda d: flax_models.gpt_fsdp(d=d),
               "flax_resnet_dp": lambda d: flax_models.resnet_dp(width=max(8, d // 16)),
               "flax_vit_2d": lambda d: flax_models.vit_2d(d=d)}
except ImportError:
    pass


# ------------------------------------------------------------------ runs --
def xla_partition(fn, args) -> tuple[str, str]:
    """(the lowered module's HLO text, XLA's after_spmd-partitioning module).

    The text gets the `allow_spmd_sharding_propagation_to_parameters/output` flags JAX compiled
    it with (read from the compiled module): `.as_text()` does not record them, and without
    them sharding-propagation, like XLA, leaves unannotated results to be replicated."""
    lowered = fn.lower(*args)
    text = lowered.as_text(dialect="hlo")
    with tempfile.TemporaryDirectory() as d:
        compiled = lowered.compile(compiler_options={"xla_dump_to": d, "xla_dump_hlo_pass_re": "spmd-partitioning"})
        dumped = sorted(Path(d).glob("*after_spmd-partitioning*.txt"))
        return with_propagation_flags(text, compiled.as_text().split("\n", 1)[0]), dumped[-1].read_text()


def measure(text: str, model: CostModel) -> tuple[int, float, float, int, float]:
    """Bytes a step sends (a loop body's collectives times its trip count), XLA's FLOPs of the
    module (HloCostAnalysis: loop bodies once, for both), the cost model's step estimate, and
    the wire bytes it charges (each collective's ring volume: an all-reduce 2(g-1)/g of its
    buffer, an all-gather, reduce-scatter or all-to-all (g-1)/g, loop bodies once).  The first
    count is each collective's operand size, which rates a reduce-scatter at the whole buffer
    and an all-gather at one shard: wire bytes compare plans that mix them fairly."""
    module = parse_module(text)
    stats = module_stats(module, executed=True)
    flops = cost_analysis(text).get("flops", 0.0)
    estimate = module_estimate(module, model)
    return (sum(stats.collective_bytes.values()), flops, estimate.step_seconds(model.profile), estimate.bytes,
            estimate.seconds + estimate.latency_seconds)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", default="256,1024,4096")
    ap.add_argument("--profile", default="accelerator")
    ap.add_argument("--only", help="comma-separated models: " + ", ".join(MODELS))
    ap.add_argument("--lowering", choices=("gspmd", "shardy"), default="gspmd")
    ap.add_argument("--verify-up-to", type=int, default=256, help="verify numerically models up to this width")
    args = ap.parse_args(argv)
    jax.config.update("jax_use_shardy_partitioner", args.lowering == "shardy")
    model = CostModel.for_profile(args.profile)
    names = args.only.split(",") if args.only else list(MODELS)
    rows = []
    print(f"{'model':10} {'d':>5} | {'bytes ours':>12} {'XLA':>12} {'x':>5} | {'wire x':>6} | {'GFLOP ours':>10} "
          f"{'XLA':>10} {'x':>5} | {'est ms ours':>11} {'XLA':>9} | {'exp ms ours':>11} {'XLA':>9} | verified")
    for name in names:
        for d in map(int, args.widths.split(",")):
            fn, fargs = MODELS[name](d)
            text, xla = xla_partition(fn, fargs)
            module = parse_module(text)
            SpmdPartitioner(num_partitions=8, cost_profile=args.profile).run(module)
            ours = print_module(module)
            ob, of, ot, ow, oe = measure(ours, model)
            xb, xf, xt, xw, xe = measure(xla, model)
            verified = "-"
            if d <= args.verify_up_to:
                verified = "yes" if verify_equivalent(text, ours).ok else "NO"
            rows.append((ob / xb if xb else 1.0, of / xf if xf else 1.0, ow / xw if xw else 1.0))
            print(f"{name:10} {d:5d} | {ob:12,} {xb:12,} {ob / xb if xb else 1:5.2f} | {ow / xw if xw else 1:6.2f} | "
                  f"{of / 1e9:10.3f} "
                  f"{xf / 1e9:10.3f} {of / xf if xf else 1:5.2f} | {ot * 1e3:11.3f} {xt * 1e3:9.3f} | "
                  f"{oe * 1e3:11.3f} {xe * 1e3:9.3f} | {verified}",
                  flush=True)
    gb = math.exp(sum(math.log(max(r[0], 1e-9)) for r in rows) / len(rows))
    gf = math.exp(sum(math.log(max(r[1], 1e-9)) for r in rows) / len(rows))
    gw = math.exp(sum(math.log(max(r[2], 1e-9)) for r in rows) / len(rows))
    print(f"\ngeomean ours/XLA: bytes {gb:.2f}, wire {gw:.2f}, FLOPs {gf:.2f} over {len(rows)} models "
          f"({args.profile} profile)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
