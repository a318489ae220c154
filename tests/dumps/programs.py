"""JAX programs run the way users run them, so that XLA writes real dump directories.

    XLA_FLAGS="--xla_force_host_platform_device_count=8 --xla_dump_to=DIR" \
        python tests/dumps/programs.py [--lowering shardy|gspmd] [--only NAME ...] [--list]

Every program is *executed* (`jax.jit(f)(*args)`, `jax.pmap`, `shard_map`), as in a training
script: what XLA writes under DIR (`module_NNNN.jit_NAME.before_optimizations.txt`, pass dumps
with `--xla_dump_hlo_pass_re`, protos with `--xla_dump_hlo_as_proto`, the small helper modules
JAX compiles on the side) is exactly what a user of `--xla_dump_to` gets.  Nothing here writes
HLO itself.  The device count comes from XLA_FLAGS; programs whose mesh does not fit are skipped
(`--list` shows which need how many).

`--lowering gspmd` turns off JAX's default Shardy lowering (`jax_use_shardy_partitioner=False`).
Sizes are small (a few KB of parameters): the dumps are for tests, not benchmarks.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Callable

os.environ.setdefault("JAX_PLATFORMS", "cpu")


@dataclass(frozen=True)
class DumpProgram:
    name: str          # the jitted function's name: XLA's module is jit_<name> (pmap_<name>)
    devices: int       # devices its mesh needs
    description: str
    run: Callable[[], object]
    module: str = ""   # XLA's module name, when it is not jit_<name>

    def __post_init__(self):
        if not self.module:
            object.__setattr__(self, "module", f"jit_{self.name}")


PROGRAMS: dict[str, DumpProgram] = {}


def program(devices: int, description: str, module: str = ""):
    def register(run):
        PROGRAMS[run.__name__] = DumpProgram(run.__name__, devices, description, run, module)
        return run
    return register


def _setup():
    """Imports that need the environment (XLA_FLAGS) settled first."""
    global jax, jnp, np, lax, Mesh, NamedSharding, P, shard_map
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    try:
        from jax import shard_map
    except ImportError:  # older jax
        from jax.experimental.shard_map import shard_map


def _mesh(shape, names):
    return Mesh(np.array(jax.devices()[:int(np.prod(shape))]).reshape(shape), names)


def _put(x, mesh, spec):
    return jax.device_put(x, NamedSharding(mesh, spec))


def _rand(seed, *shape, scale=0.5):
    return jnp.asarray(np.random.default_rng(seed).uniform(-scale, scale, shape).astype(np.float32))


# ---------------------------------------------------------------- programs --
@program(8, "Megatron MLP training step on a data=2 x model=4 mesh (SGD)")
def megatron_mlp():
    m = _mesh((2, 4), ("data", "model"))
    x = _put(_rand(0, 16, 32), m, P("data", None))
    w1 = _put(_rand(1, 32, 64), m, P(None, "model"))
    w2 = _put(_rand(2, 64, 32), m, P("model", None))

    def megatron_mlp(params, x):
        def loss(p):
            return jnp.mean((jax.nn.gelu(x @ p[0]) @ p[1]) ** 2)
        g = jax.grad(loss)(params)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, g)
    return jax.jit(megatron_mlp)((w1, w2), x)


@program(8, "data-parallel SGD-momentum step on a 1-D mesh of 8, weights replicated, donated state")
def dp_momentum():
    m = _mesh((8,), ("data",))
    x = _put(_rand(3, 32, 16), m, P("data", None))
    y = _put(_rand(4, 32, 4), m, P("data", None))
    w = _put(_rand(5, 16, 4), m, P())
    v = _put(jnp.zeros((16, 4)), m, P())

    def dp_momentum(w, v, x, y):
        g = jax.grad(lambda w: jnp.mean((jnp.tanh(x @ w) - y) ** 2))(w)
        v = 0.9 * v + g
        return w - 0.05 * v, v
    return jax.jit(dp_momentum, donate_argnums=(0, 1))(w, v, x, y)


@program(8, "FSDP: weights sharded over the data axis, gathered for compute, Adam-style update")
def fsdp_adam():
    m = _mesh((8,), ("data",))
    x = _put(_rand(6, 16, 32), m, P("data", None))
    w1 = _put(_rand(7, 32, 64), m, P("data", None))
    w2 = _put(_rand(8, 64, 32), m, P("data", None))
    mu = jax.tree.map(jnp.zeros_like, (w1, w2))

    def fsdp_adam(params, mu, x):
        def loss(p):
            return jnp.mean(jnp.tanh(jnp.tanh(x @ p[0]) @ p[1]) ** 2)
        g = jax.grad(loss)(params)
        mu = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g * g, mu, g)
        params = jax.tree.map(lambda p, g, m: p - 0.01 * g / (jnp.sqrt(m) + 1e-3), params, g, mu)
        return params, mu
    return jax.jit(fsdp_adam)((w1, w2), mu, x)


@program(8, "self-attention with gradients, heads sharded over model=4, batch over data=2")
def attention_grad():
    m = _mesh((2, 4), ("data", "model"))
    x = _put(_rand(9, 4, 8, 16), m, P("data", None, None))
    wq = _put(_rand(10, 16, 4, 8), m, P(None, "model", None))
    wk = _put(_rand(11, 16, 4, 8), m, P(None, "model", None))
    wv = _put(_rand(12, 16, 4, 8), m, P(None, "model", None))
    wo = _put(_rand(13, 4, 8, 16), m, P("model", None, None))

    def attention_grad(p, x):
        def loss(p):
            wq, wk, wv, wo = p
            q, k, v = (jnp.einsum("bsd,dhe->bhse", x, w) for w in (wq, wk, wv))
            a = jax.nn.softmax(jnp.einsum("bhse,bhte->bhst", q, k) / 8.0, axis=-1)
            return jnp.sum(jnp.einsum("bhst,bhte,hed->bsd", a, v, wo) ** 2)
        return jax.grad(loss)(p)
    return jax.jit(attention_grad)((wq, wk, wv, wo), x)


@program(8, "mixture of experts: tokens routed by a one-hot einsum, experts sharded over 8")
def moe():
    m = _mesh((8,), ("expert",))
    x = _put(_rand(14, 32, 16), m, P())
    gate = _put(_rand(15, 16, 8), m, P())
    w = _put(_rand(16, 8, 16, 16), m, P("expert", None, None))

    def moe(x, gate, w):
        route = jax.nn.one_hot(jnp.argmax(x @ gate, axis=-1), 8)
        per_expert = jnp.einsum("te,td->etd", route, x)
        per_expert = jax.lax.with_sharding_constraint(per_expert, NamedSharding(m, P("expert", None, None)))
        out = jnp.einsum("etd,edf->etf", per_expert, w)
        return jnp.einsum("etf,te->tf", out, route)
    return jax.jit(moe)(x, gate, w)


@program(8, "convolution sharded spatially (height over 4) with batch over 2")
def spatial_conv():
    m = _mesh((2, 4), ("data", "space"))
    x = _put(_rand(17, 2, 16, 8, 3), m, P("data", "space", None, None))
    k = _put(_rand(18, 3, 3, 3, 4), m, P())

    def spatial_conv(x, k):
        y = lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jnp.sum(jax.nn.relu(y), axis=(1, 2))
    return jax.jit(spatial_conv)(x, k)


@program(8, "uneven shards: 10 and 6 rows constrained over 4 and 8 devices")
def uneven():
    m = _mesh((8,), ("x",))
    a = _put(_rand(19, 10, 8), m, P())
    b = _put(_rand(20, 8, 6), m, P())

    def uneven(a, b):
        a = jax.lax.with_sharding_constraint(jnp.sin(a), NamedSharding(m, P("x", None)))
        c = jax.lax.with_sharding_constraint(a @ b, NamedSharding(m, P(None, "x")))
        return jnp.cumsum(c, axis=0), jnp.sum(c)
    return jax.jit(uneven)(a, b)


@program(8, "scanned layers: lax.scan over 4 stacked weight matrices sharded over model=8")
def scan_layers():
    m = _mesh((8,), ("model",))
    x = _put(_rand(21, 8, 16), m, P())
    ws = _put(_rand(22, 4, 16, 16), m, P(None, None, "model"))

    def scan_layers(ws, x):
        def layer(h, w):
            return jnp.tanh(h @ w), jnp.sum(h)
        h, sums = jax.lax.scan(layer, x, ws)
        return h, sums
    return jax.jit(scan_layers)(ws, x)


@program(8, "shard_map with 20 psums (and a ppermute) over a 1-D mesh of 8")
def shard_map_psums():
    m = _mesh((8,), ("i",))
    x = _put(_rand(23, 8, 20, 4), m, P("i", None, None))

    def body(x):
        total = jnp.zeros((1, 4))
        for j in range(20):
            total = total + lax.psum(x[:, j, :] * (j + 1), "i")
        shifted = lax.ppermute(x[:, 0, :], "i", [(k, (k + 1) % 8) for k in range(8)])
        return total, shifted

    def shard_map_psums(x):
        return shard_map(body, mesh=m, in_specs=P("i", None, None), out_specs=(P(), P("i", None)))(x)
    return jax.jit(shard_map_psums)(x)


@program(8, "shard_map over one axis of a 2-D mesh (partially manual), data-parallel gradient mean")
def shard_map_2d():
    m = _mesh((4, 2), ("data", "model"))
    x = _put(_rand(24, 16, 8), m, P("data", None))
    w = _put(_rand(25, 8, 8), m, P(None, "model"))

    def grads(w, x):
        g = jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
        return lax.pmean(g, "data")

    def shard_map_2d(w, x):
        g = shard_map(grads, mesh=m, in_specs=(P(), P("data", None)), out_specs=P(),
                      axis_names=frozenset({"data"}))(w, x)
        return w - 0.1 * g
    return jax.jit(shard_map_2d)(w, x)


@program(8, "pmap-style data parallelism: per-device batches, gradients averaged with pmean",
         module="jit__fun")  # jax.pmap lowers through shard_map: XLA names the module jit__fun
def pmap_step():
    n = 8
    w = jnp.stack([_rand(26, 8, 4)] * n)
    x = jnp.stack([_rand(27 + i, 4, 8) for i in range(n)])

    def pmap_step(w, x):
        g = jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
        return w - 0.1 * lax.pmean(g, "batch")
    return jax.pmap(pmap_step, axis_name="batch")(w, x)


@program(8, "bf16 transformer-style block with remat, explicit out_shardings and an int32 output")
def bf16_remat():
    m = _mesh((2, 4), ("data", "model"))
    x = _put(_rand(50, 8, 32).astype(jnp.bfloat16), m, P("data", None))
    w1 = _put(_rand(51, 32, 64).astype(jnp.bfloat16), m, P(None, "model"))
    w2 = _put(_rand(52, 64, 32).astype(jnp.bfloat16), m, P("model", None))

    @jax.checkpoint
    def block(x, w1, w2):
        return x + jax.nn.relu(x @ w1) @ w2

    def bf16_remat(x, w1, w2):
        g = jax.grad(lambda w1: jnp.sum(block(x, w1, w2).astype(jnp.float32) ** 2))(w1)
        return g, jnp.argmax(block(x, w1, w2), axis=-1).astype(jnp.int32)
    out = (NamedSharding(m, P(None, "model")), NamedSharding(m, P("data")))
    return jax.jit(bf16_remat, out_shardings=out)(x, w1, w2)


@program(8, "shard_map collectives: all_to_all, psum_scatter, all_gather, ppermute ring, axis_index")
def shard_map_collectives():
    m = _mesh((8,), ("i",))
    x = _put(_rand(53, 64, 8), m, P("i", None))

    def body(x):
        a = lax.all_to_all(x.reshape(8, 1, 8), "i", 0, 0, tiled=True).reshape(8, 8)
        s = lax.psum_scatter(a, "i", scatter_dimension=0, tiled=True)
        g = lax.all_gather(s, "i", tiled=True)
        r = lax.ppermute(g, "i", [(k, (k + 1) % 8) for k in range(8)])
        return r * lax.axis_index("i").astype(jnp.float32)

    def shard_map_collectives(x):
        return shard_map(body, mesh=m, in_specs=P("i", None), out_specs=P("i", None))(x)
    return jax.jit(shard_map_collectives)(x)


@program(8, "partially manual shard_map (axis_names={'x'}) reading axis_index: an operand-less manual call")
def partial_axis_index():
    m = _mesh((2, 4), ("x", "y"))
    x = _put(_rand(61, 16, 32), m, P("x", "y"))

    def body(x):
        return x + lax.axis_index("x").astype(x.dtype) * 100.0

    def partial_axis_index(x):
        return shard_map(body, mesh=m, in_specs=P("x"), out_specs=P("x"), axis_names={"x"})(x).sum(axis=1)
    return jax.jit(partial_axis_index)(x)


@program(8, "control flow: lax.cond and a fori_loop over a sharded carry, with a psum inside shard_map")
def control_flow():
    m = _mesh((4, 2), ("data", "model"))
    x = _put(_rand(54, 16, 8), m, P("data", "model"))
    flag = jnp.int32(1)

    def control_flow(flag, x):
        y = lax.cond(flag > 0, lambda v: jnp.sin(v), lambda v: jnp.cos(v), x)
        y = lax.fori_loop(0, 3, lambda i, v: v * 0.5 + jnp.tanh(v), y)

        def body(v):
            return lax.psum(jnp.sum(v, axis=0, keepdims=True), "data")
        total = shard_map(body, mesh=m, in_specs=P("data", "model"), out_specs=P(None, "model"))(y)
        return y, total
    return jax.jit(control_flow)(flag, x)


@program(8, "gather and scatter-add on a row-sharded embedding table (token lookup and its gradient)")
def embedding():
    m = _mesh((8,), ("v",))
    table = _put(_rand(55, 64, 16), m, P("v", None))
    ids = jnp.asarray(np.random.default_rng(56).integers(0, 64, (4, 8)).astype(np.int32))

    def embedding(table, ids):
        def loss(t):
            return jnp.sum(jnp.tanh(jnp.take(t, ids, axis=0)) ** 2)
        return jax.grad(loss)(table)
    return jax.jit(embedding)(table, ids)


@program(8, "layer norm + softmax cross-entropy over a vocabulary sharded 8 ways, with a dropout mask from a key")
def vocab_parallel_loss():
    m = _mesh((8,), ("v",))
    h = _put(_rand(57, 8, 16), m, P())
    w = _put(_rand(58, 16, 64), m, P(None, "v"))
    labels = jnp.asarray(np.random.default_rng(59).integers(0, 64, (8,)).astype(np.int32))
    key = jax.random.key(0)

    def vocab_parallel_loss(h, w, labels, key):
        mu = jnp.mean(h, axis=-1, keepdims=True)
        hn = (h - mu) / jnp.sqrt(jnp.var(h, axis=-1, keepdims=True) + 1e-5)
        keep = jax.random.bernoulli(key, 0.9, hn.shape)
        logits = (jnp.where(keep, hn, 0.0) / 0.9) @ w
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))
    return jax.jit(vocab_parallel_loss)(h, w, labels, key)


@program(16, "Megatron MLP on a data=4 x model=4 mesh (for verification past 8 devices)")
def megatron_16():
    m = _mesh((4, 4), ("data", "model"))
    x = _put(_rand(40, 16, 32), m, P("data", None))
    w1 = _put(_rand(41, 32, 64), m, P(None, "model"))
    w2 = _put(_rand(42, 64, 32), m, P("model", None))

    def megatron_16(w1, w2, x):
        return jnp.sum(jax.nn.relu(x @ w1) @ w2, axis=0)
    return jax.jit(megatron_16)(w1, w2, x)


@program(64, "a 2-D data=8 x model=8 matmul chain on 64 devices")
def matmul_64():
    m = _mesh((8, 8), ("data", "model"))
    x = _put(_rand(43, 16, 64), m, P("data", None))
    w1 = _put(_rand(44, 64, 64), m, P(None, "model"))
    w2 = _put(_rand(45, 64, 16), m, P("model", None))

    def matmul_64(w1, w2, x):
        return jnp.tanh(jnp.tanh(x @ w1) @ w2)
    return jax.jit(matmul_64)(w1, w2, x)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lowering", choices=("shardy", "gspmd"), default="shardy")
    ap.add_argument("--only", nargs="*", help="programs to run (default: every one that fits)")
    ap.add_argument("--list", action="store_true", help="list the programs and the devices each needs")
    args = ap.parse_args(argv)
    if args.list:
        for p in PROGRAMS.values():
            print(f"{p.name:18} {p.devices:3} devices  {p.description}")
        return 0
    _setup()
    jax.config.update("jax_use_shardy_partitioner", args.lowering == "shardy")
    have = len(jax.devices())
    names = args.only or [p.name for p in PROGRAMS.values() if p.devices <= have and
                          (p.devices == have or p.devices <= 8)]
    for name in names:
        p = PROGRAMS[name]
        if p.devices > have:
            print(f"skipped {name}: needs {p.devices} devices, have {have}", file=sys.stderr)
            continue
        jax.block_until_ready(p.run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
