"""Generates large real HLO dumps: a 12-layer transformer training step.

Writes bench-data/transformer12.lowered.hlo (jax.jit(...).lower(...).as_text(dialect="hlo"))
and bench-data/transformer12.compiled.hlo (.compile().as_text()).  The model is
big in layers and ops, small in tensor sizes, so compiling stays quick.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

OUT = Path(__file__).resolve().parents[1] / "bench-data"


def make(num_layers: int = 12, d_model: int = 64, heads: int = 4, seq: int = 16, batch: int = 4):
    import jax
    import jax.numpy as jnp

    def layer_norm(x, g, b):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(v + 1e-5) * g + b

    def block(p, x):
        h = layer_norm(x, p["ln1_g"], p["ln1_b"])
        q, k, v = (h @ p[n] for n in ("wq", "wk", "wv"))
        split = lambda t: t.reshape(batch, seq, heads, d_model // heads).transpose(0, 2, 1, 3)
        q, k, v = split(q), split(k), split(v)
        att = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / jnp.sqrt(d_model // heads), axis=-1)
        o = (att @ v).transpose(0, 2, 1, 3).reshape(batch, seq, d_model) @ p["wo"]
        x = x + o
        h = layer_norm(x, p["ln2_g"], p["ln2_b"])
        return x + jax.nn.gelu(h @ p["w1"]) @ p["w2"]

    def loss(params, x, y):
        for p in params:
            x = block(p, x)
        return ((x - y) ** 2).mean()

    def step(params, opt, x, y):
        l, g = jax.value_and_grad(loss)(params, x, y)
        m, v = opt
        m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
        v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, v, g)
        params = jax.tree.map(lambda p, m, v: p - 1e-3 * m / (jnp.sqrt(v) + 1e-8), params, m, v)
        return params, (m, v), l

    key = jax.random.PRNGKey(0)
    def init():
        shapes = {"ln1_g": (d_model,), "ln1_b": (d_model,), "ln2_g": (d_model,), "ln2_b": (d_model,),
                  "wq": (d_model, d_model), "wk": (d_model, d_model), "wv": (d_model, d_model),
                  "wo": (d_model, d_model), "w1": (d_model, 4 * d_model), "w2": (4 * d_model, d_model)}
        return {k: jnp.ones(s, jnp.float32) * 0.01 for k, s in shapes.items()}
    params = [init() for _ in range(num_layers)]
    opt = (jax.tree.map(jnp.zeros_like, params), jax.tree.map(jnp.zeros_like, params))
    x = jax.random.normal(key, (batch, seq, d_model))
    lowered = jax.jit(step).lower(params, opt, x, x)
    OUT.mkdir(exist_ok=True)
    (OUT / f"transformer{num_layers}.lowered.hlo").write_text(lowered.as_text(dialect="hlo"))
    (OUT / f"transformer{num_layers}.compiled.hlo").write_text(lowered.compile().as_text())


if __name__ == "__main__":
    make(int(sys.argv[1]) if len(sys.argv) > 1 else 12)
    for f in sorted(OUT.glob("transformer*.hlo")):
        print(f, f.stat().st_size)
