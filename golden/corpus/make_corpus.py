"""Generates golden/corpus: HLO text of real JAX programs, as JAX and XLA print it.

    .venv/bin/python golden/corpus/make_corpus.py [--only NAME ...]

For each program P (a function below, registered in PROGRAMS) it writes
golden/corpus/P/P.lowered.shardy.hlo (`jax.jit(f).lower(...).as_text(dialect="hlo")`
with JAX's default Shardy lowering), P.lowered.gspmd.hlo (the same with
`jax_use_shardy_partitioner=False`) and P.compiled.hlo (`.compile().as_text()`).
Sharded programs also get P.xla_spmd.hlo: XLA's own SPMD-partitioned module
(from `--xla_dump_to`, run in a subprocess), the oracle for our partitioner.
Every file is checked with XLA's parser before it is written.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DUMP_ENV = "HLO_PASSES_CORPUS_DUMP"
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

KEY = jax.random.PRNGKey(0)


def f32(*shape):
    return jnp.asarray(np.random.default_rng(len(shape)).uniform(-1, 1, shape), jnp.float32)


def mesh(*shape):
    names = ("x", "y", "z")[: len(shape)]
    return jax.make_mesh(shape, names, devices=jax.devices()[: int(np.prod(shape))],
                         axis_types=(jax.sharding.AxisType.Auto,) * len(shape))


def put(x, m, spec):
    return jax.device_put(x, NamedSharding(m, spec))


# ------------------------------------------------------------------ programs --
def mlp_train_step():
    def loss(p, x, y):
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)

    def step(p, x, y):
        g = jax.grad(loss)(p, x, y)
        return jax.tree.map(lambda a, b: a - 0.1 * b, p, g)

    p = {"w1": f32(16, 32), "b1": f32(32), "w2": f32(32, 4), "b2": f32(4)}
    return step, (p, f32(8, 16), f32(8, 4))


def transformer_block():
    def ln(x):
        m = x.mean(-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5)

    def block(p, x):
        h = ln(x)
        q, k, v = h @ p["q"], h @ p["k"], h @ p["v"]
        a = jax.nn.softmax(q @ k.swapaxes(-1, -2) / 4.0, axis=-1)
        x = x + (a @ v) @ p["o"]
        return x + jax.nn.gelu(ln(x) @ p["w1"]) @ p["w2"]

    def step(p, m, x):
        l, g = jax.value_and_grad(lambda p: jnp.mean(block(p, x) ** 2))(p)
        m = jax.tree.map(lambda m, g: 0.9 * m + g, m, g)
        return jax.tree.map(lambda p, m: p - 0.01 * m, p, m), m, l

    p = {n: f32(16, 16) for n in "qkvo"} | {"w1": f32(16, 32), "w2": f32(32, 16)}
    return step, (p, jax.tree.map(jnp.zeros_like, p), f32(2, 8, 16))


def convnet_bn():
    def net(w, x):
        y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        mu, var = y.mean((0, 1, 2)), y.var((0, 1, 2))
        y = jax.nn.relu((y - mu) * jax.lax.rsqrt(var + 1e-5))
        return jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID").mean()

    return jax.grad(net), (f32(3, 3, 3, 8), f32(2, 8, 8, 3))


def moe_layer():
    def moe(gate, experts, x):
        logits = x @ gate
        top, idx = jax.lax.top_k(logits, 2)
        w = jax.nn.softmax(top, -1)
        onehot = jax.nn.one_hot(idx, experts.shape[0])
        dispatch = jnp.einsum("tk,tke->te", w, onehot)
        out = jnp.einsum("td,edf->tef", x, experts)
        return jnp.einsum("te,tef->tf", dispatch, out)

    return moe, (f32(16, 4), f32(4, 16, 16), f32(8, 16))


def scan_while():
    def rnn(w, xs):
        h, ys = jax.lax.scan(lambda h, x: (jnp.tanh(h @ w + x),) * 2, jnp.zeros(8), xs)
        n = jax.lax.while_loop(lambda c: c[0] < 5, lambda c: (c[0] + 1, c[1] * 1.5), (0, h))
        return ys.sum() + n[1].sum()

    return rnn, (f32(8, 8), f32(6, 8))


def cond_switch():
    def f(i, x):
        y = jax.lax.cond(x.sum() > 0, jnp.sin, jnp.cos, x)
        return jax.lax.switch(i, [jnp.exp, jnp.tanh, lambda v: v * 2], y)

    return f, (jnp.int32(1), f32(8))


def sort_topk():
    return (lambda x: (jnp.sort(x, -1), jnp.argsort(x, -1), jax.lax.top_k(x, 3))), (f32(4, 10),)


def gather_scatter():
    def f(x, idx, upd):
        return x[idx], x.at[idx].add(upd), jnp.take_along_axis(x[:4], idx[:, None] % 4, 1)

    return f, (f32(10, 4), jnp.array([1, 3, 3, 7], jnp.int32), f32(4, 4))


def rng():
    def f(key, x):
        k1, k2 = jax.random.split(key)
        return x + jax.random.normal(k1, x.shape), jax.random.bernoulli(k2, 0.3, x.shape)

    return f, (KEY, f32(4, 8))


def shard_map_collectives():
    from jax import shard_map

    m = mesh(8)

    def body(x):
        s = jax.lax.psum(x, "x")
        g = jax.lax.all_gather(x, "x", tiled=True)
        p = jax.lax.ppermute(x, "x", [(i, (i + 1) % 8) for i in range(8)])
        r = jax.lax.psum_scatter(g, "x", tiled=True)
        return s + p + r

    f = shard_map(body, mesh=m, in_specs=P("x"), out_specs=P("x"))
    return f, (put(f32(16, 4), m, P("x")),)


def sharded_megatron_mlp():
    m = mesh(4, 2)

    def f(x, w1, w2):
        h = jax.nn.relu(x @ w1)
        h = jax.lax.with_sharding_constraint(h, NamedSharding(m, P("x", "y")))
        return h @ w2

    return f, (put(f32(16, 32), m, P("x", None)), put(f32(32, 64), m, P(None, "y")),
               put(f32(64, 32), m, P("y", None)))


def sharded_fsdp():
    m = mesh(8)

    def f(x, w):
        w = jax.lax.with_sharding_constraint(w, NamedSharding(m, P()))
        return jnp.tanh(x @ w).sum(0)

    return f, (put(f32(16, 32), m, P("x")), put(f32(32, 32), m, P("x")))


def sharded_3d_uneven():
    m = mesh(2, 2, 2)

    def f(a, b):
        return (a * 2 + 1).T.reshape(6, 10) @ b

    return f, (put(f32(10, 6), m, P("x", None)), put(f32(10, 4), m, P(None, "z")))


def train_dp_adam():
    m = mesh(8)

    def step(p, opt, x, y):
        l, g = jax.value_and_grad(lambda p: jnp.mean((jnp.tanh(x @ p["w"] + p["b"]) - y) ** 2))(p)
        mu, nu = opt
        mu = jax.tree.map(lambda a, b: 0.9 * a + 0.1 * b, mu, g)
        nu = jax.tree.map(lambda a, b: 0.999 * a + 0.001 * b * b, nu, g)
        p = jax.tree.map(lambda p, a, b: p - 1e-3 * a / (jnp.sqrt(b) + 1e-8), p, mu, nu)
        return p, (mu, nu), l

    p = {"w": put(f32(10, 6), m, P()), "b": put(f32(6), m, P())}
    zeros = jax.tree.map(jnp.zeros_like, p)
    return step, (p, (zeros, zeros), put(f32(32, 10), m, P("x")), put(f32(32, 6), m, P("x")))


PROGRAMS = {f.__name__: f for f in [
    mlp_train_step, transformer_block, convnet_bn, moe_layer, scan_while, cond_switch, sort_topk,
    gather_scatter, rng, shard_map_collectives, sharded_megatron_mlp, sharded_fsdp, sharded_3d_uneven,
    train_dp_adam]}
SHARDED = {"sharded_megatron_mlp", "sharded_fsdp", "sharded_3d_uneven", "train_dp_adam"}


def xla_accepts(text: str) -> None:
    from jax._src.lib import xla_client as xc

    xc.hlo.hlo_module_from_text(text)


def lower(name: str, shardy: bool):
    jax.config.update("jax_use_shardy_partitioner", shardy)
    try:
        fn, args = PROGRAMS[name]()
        return jax.jit(fn).lower(*args)
    finally:
        jax.config.update("jax_use_shardy_partitioner", True)


def xla_spmd(name: str) -> tuple[str | None, dict[str, str]]:
    """XLA's partitioned module for a sharded program, and the raw pass-by-pass dump files
    around XLA's SPMD partitioner, from a dump made in a subprocess."""
    with tempfile.TemporaryDirectory() as dump:
        env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count=8 --xla_dump_to={dump} "
                   "--xla_dump_hlo_pass_re=spmd-partitioning", **{DUMP_ENV: name})
        subprocess.run([sys.executable, __file__], env=env, check=True)
        files = sorted(glob.glob(f"{dump}/*jit_{name.split('_', 1)[0]}*after_spmd-partitioning*")) or sorted(
            glob.glob(f"{dump}/*after_spmd-partitioning*"))
        if not files:
            return None, {}
        from jax._src.lib import xla_client as xc

        raw = {f"dump/{Path(f).name}": Path(f).read_text()
               for f in glob.glob(f"{dump}/*spmd-partitioning*")[:4]}
        return xc.hlo.hlo_module_from_text(Path(files[-1]).read_text()).to_string(), raw


def make(name: str) -> list[Path]:
    out = HERE / name
    texts = {
        f"{name}.lowered.shardy.hlo": lower(name, True).as_text(dialect="hlo"),
        f"{name}.lowered.gspmd.hlo": lower(name, False).as_text(dialect="hlo"),
        f"{name}.compiled.hlo": lower(name, True).compile().as_text(),
    }
    if name in SHARDED:
        spmd, raw_dumps = xla_spmd(name)
        if spmd is not None:
            texts[f"{name}.xla_spmd.hlo"] = spmd
            texts.update({k.removesuffix(".txt") + ".hlo": v for k, v in raw_dumps.items()})
    for text in texts.values():
        xla_accepts(text)
    out.mkdir(exist_ok=True)
    written = []
    for fname, text in texts.items():
        (out / fname).parent.mkdir(exist_ok=True)
        (out / fname).write_text(text)
        written.append(out / fname)
    return written


def main() -> None:
    if os.environ.get(DUMP_ENV):  # child: compile one program under --xla_dump_to
        lower(os.environ[DUMP_ENV], True).compile()
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    for name in args.only or PROGRAMS:
        files = make(name)
        print(f"{name}: {', '.join(f.name for f in files)}")


if __name__ == "__main__":
    main()
