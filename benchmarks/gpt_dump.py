"""A real large partitioned program for the view benchmark: a GPT training step on 8 devices.

    .venv/bin/python benchmarks/gpt_dump.py [LAYERS]        # default 24

Runs `jax.jit(step)` once with XLA dumping (`--xla_dump_to=bench-data/gpt24.dump`,
`--xla_dump_hlo_pass_re=spmd-partitioning`), the way a user gets a dump directory.  The model is a
decoder-only transformer (embedding, LAYERS blocks of attention + MLP with biases and dropout, tied
unembedding, softmax cross-entropy) with Adam, on a 2×4 mesh: batch over 'data', Megatron tensor parallelism over
'model' (wq/wk/wv/w1 column-split, wo/w2 row-split).  One `with_sharding_constraint` in every
block (`ANNOTATED_LINE` below) asks for the attention output replicated over 'model', which costs
an all-reduce: the one a user hunts for in the view.  Tensor sizes are small so that compiling
stays quick; the instruction count is what matters here.

Writes bench-data/gpt{LAYERS}.dump/ and prints the module files it holds.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = int(sys.argv[1]) if len(sys.argv) > 1 else 24
OUT = ROOT / "bench-data" / f"gpt{LAYERS}.dump"
os.environ["XLA_FLAGS"] = (f"--xla_force_host_platform_device_count=8 --xla_dump_to={OUT} "
                           "--xla_dump_hlo_pass_re=spmd-partitioning")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import re  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

jax.config.update("jax_hlo_source_file_canonicalization_regex", "^" + re.escape(f"{ROOT}/"))

D, HEADS, FF, SEQ, BATCH, VOCAB = 64, 4, 256, 32, 8, 512


def main() -> None:
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)

    def spec(*names):
        return NamedSharding(mesh, P(*names))

    def layer_norm(x, g, b):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(v + 1e-5) * g + b

    def dropout(key, x, rate=0.1):
        keep = jax.random.bernoulli(key, 1 - rate, x.shape)
        return jnp.where(keep, x / (1 - rate), 0)

    def attention(p, x, key):
        h = layer_norm(x, p["ln1_g"], p["ln1_b"])
        q, k, v = (jnp.einsum("bsd,dh->bsh", h, p[n]) + p["b" + n[1]] for n in ("wq", "wk", "wv"))
        split = lambda t: t.reshape(BATCH, SEQ, HEADS, D // HEADS)
        q, k, v = split(q), split(k), split(v)
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(D // HEADS)
        mask = jnp.tril(jnp.ones((SEQ, SEQ), bool))
        att = dropout(key, jax.nn.softmax(jnp.where(mask, logits, -1e9), axis=-1))
        o = jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(BATCH, SEQ, D)
        o = jnp.einsum("bsh,hd->bsd", o, p["wo"])
        return jax.lax.with_sharding_constraint(o, spec("data", None, None))  # ANNOTATED_LINE

    def mlp(p, x, key):
        h = layer_norm(x, p["ln2_g"], p["ln2_b"])
        h = jax.nn.gelu(jnp.einsum("bsd,df->bsf", h, p["w1"]) + p["b1"])
        return dropout(key, jnp.einsum("bsf,fd->bsd", h, p["w2"]) + p["b2"])

    def block(p, x, key):
        k1, k2 = jax.random.split(key)
        x = x + attention(p, x, k1)
        return x + mlp(p, x, k2)

    def loss(params, tokens, targets, key):
        x = params["embed"][tokens]
        for i, p in enumerate(params["blocks"]):
            with jax.named_scope(f"layer{i}"):
                x = block(p, x, jax.random.fold_in(key, i))
        logits = jnp.einsum("bsd,vd->bsv", layer_norm(x, params["lnf_g"], params["lnf_b"]), params["embed"])
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()

    def step(params, m, v, tokens, targets, key):
        l, g = jax.value_and_grad(loss)(params, tokens, targets, key)
        m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
        v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, v, g)
        params = jax.tree.map(lambda p, m, v: p - 1e-3 * m / (jnp.sqrt(v) + 1e-8), params, m, v)
        return params, m, v, l

    rng = np.random.default_rng(0)

    def w(shape, *names):
        return jax.device_put(rng.normal(0, 0.02, shape).astype(np.float32), spec(*names))

    def block_params():
        return {"ln1_g": w((D,), None), "ln1_b": w((D,), None), "ln2_g": w((D,), None), "ln2_b": w((D,), None),
                "wq": w((D, D), None, "model"), "wk": w((D, D), None, "model"), "wv": w((D, D), None, "model"),
                "wo": w((D, D), "model", None), "w1": w((D, FF), None, "model"), "w2": w((FF, D), "model", None),
                "bq": w((D,), "model"), "bk": w((D,), "model"), "bv": w((D,), "model"),
                "b1": w((FF,), "model"), "b2": w((D,), None)}

    params = {"embed": w((VOCAB, D), None, None), "lnf_g": w((D,), None), "lnf_b": w((D,), None),
              "blocks": [block_params() for _ in range(LAYERS)]}
    zeros = jax.tree.map(jnp.zeros_like, params)
    tokens = jax.device_put(rng.integers(0, VOCAB, (BATCH, SEQ)).astype(np.int32), spec("data", None))
    out = jax.jit(step)(params, zeros, zeros, tokens, tokens, jax.random.key(0))
    jax.block_until_ready(out)


if __name__ == "__main__":
    main()
    for f in sorted(OUT.glob("*jit_step*")):
        print(f, f.stat().st_size)
