"""Generates golden/corpus: HLO text of real JAX programs, exactly as JAX and XLA print it.

    .venv/bin/python golden/corpus/make_corpus.py [--out DIR] [--only NAME ...] [--list]

For each program P (a builder below, registered in PROGRAMS) it writes into DIR/P/:

    P.lowered.shardy.hlo   `jax.jit(f).lower(*args).as_text(dialect="hlo")`, JAX's default (Shardy) lowering
    P.lowered.gspmd.hlo    the same with `jax_use_shardy_partitioner=False` (GSPMD `sharding={...}` attributes)
    P.compiled.hlo         `.compile().as_text()`: XLA:CPU's optimized, scheduled module
    P.xla_spmd.hlo         multi-device programs: XLA's own SPMD-partitioned module (the dump file after
                           the `spmd-partitioning` pass), the oracle for our partitioner
    dump/*.hlo             a few programs: up to 6 pass-by-pass dump files (`--xla_dump_hlo_pass_re`),
                           with XLA's file names (extension .txt -> .hlo)
    meta.json              name, description, kind, num_devices, optimizer, input shapes and shardings

pmap programs are lowered with `jax.pmap(f).lower(...)`. Dumps come from per-compile debug options
(`compile(compiler_options={"xla_dump_to": ...})`), which XLA honours without restarting the process.

Every text is checked with XLA's own parser before it is written; a text XLA rejects is reported and
skipped. A program whose building, lowering or compiling fails writes nothing. The output is
deterministic for a given jax/jaxlib: inputs come from fixed seeds and source paths in metadata are
made repo-relative. Dump file names carry XLA's process-wide module number, so they match a previous
run only when the same programs ran before them (a full run).
"""

from __future__ import annotations

import os

# Before jax is imported: 8 host "devices" for the sharded, shard_map and pmap programs.
os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=8"]).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import zlib  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# source_file metadata and the FileNames table of compiled modules: "golden/corpus/make_corpus.py".
jax.config.update("jax_hlo_source_file_canonicalization_regex", "^" + re.escape(f"{ROOT}/"))

MAX_DUMP_FILES = 6


# ------------------------------------------------------------------- registry --
@dataclasses.dataclass(frozen=True)
class Built:
    """What a builder returns: the function, its example arguments and how to lower it."""

    fn: Callable
    args: tuple
    pmap_axis: str | None = None  # lowered with jax.pmap(fn, axis_name=...) instead of jax.jit
    mesh: jax.sharding.Mesh | None = None


@dataclasses.dataclass(frozen=True)
class Program:
    name: str
    kind: str  # single | sharded | pmap | shard_map | train_dp
    description: str
    build: Callable[[], Built]
    num_devices: int = 1
    optimizer: str | None = None
    dump_passes: tuple[str, ...] = ()  # keep pass-by-pass dump files around these passes


PROGRAMS: dict[str, Program] = {}


def register(prog: Program) -> None:
    assert prog.name not in PROGRAMS, prog.name
    PROGRAMS[prog.name] = prog


def program(kind: str, description: str, num_devices: int = 1, optimizer: str | None = None,
            dump_passes: tuple[str, ...] = ()):
    def deco(build):
        register(Program(build.__name__, kind, description, build, num_devices, optimizer, dump_passes))
        return build

    return deco


# -------------------------------------------------------------------- helpers --
class Rand:
    """Deterministic example inputs (numpy, so that building a program compiles nothing)."""

    def __init__(self, name: str):
        self.rng = np.random.default_rng(zlib.crc32(name.encode()))

    def f32(self, *shape, scale=0.5):
        return self.rng.uniform(-scale, scale, shape).astype(np.float32)

    def i32(self, high, *shape):
        return self.rng.integers(0, high, shape).astype(np.int32)


def mesh(shape, names):
    devices = jax.devices()[: int(np.prod(shape))]
    return jax.make_mesh(shape, names, devices=devices, axis_types=(jax.sharding.AxisType.Auto,) * len(shape))


def put(x, m, spec):
    return jax.device_put(x, NamedSharding(m, spec))


def wsc(x, m, spec):
    return lax.with_sharding_constraint(x, NamedSharding(m, spec))


def replicate(tree, n=8):
    """pmap arguments: the same value on each of n devices (a leading axis of n)."""
    return jax.tree.map(lambda a: np.broadcast_to(np.asarray(a), (n,) + np.shape(a)).copy(), tree)


def layer_norm(x, g, b):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) * lax.rsqrt(v + 1e-5) * g + b


def attention(p, x, heads):
    """Causal multi-head self-attention; p holds wqkv [d, 3d] and wo [d, d]."""
    b, s, d = x.shape
    dh = d // heads
    q, k, v = jnp.split((x @ p["wqkv"]).reshape(b, s, 3, heads, dh), 3, axis=2)
    logits = jnp.einsum("bqhd,bkhd->bhqk", q[:, :, 0], k[:, :, 0]) / np.sqrt(dh).astype(np.float32)
    logits = jnp.where(jnp.tril(jnp.ones((s, s), bool)), logits, -1e9)
    o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, -1), v[:, :, 0]).reshape(b, s, d)
    return o @ p["wo"]


def block_params(r: Rand, d: int, ff: int):
    return {"wqkv": r.f32(d, 3 * d), "wo": r.f32(d, d), "ln1": np.ones(d, np.float32), "ln2": np.ones(d, np.float32),
            "w1": r.f32(d, ff), "b1": np.zeros(ff, np.float32), "w2": r.f32(ff, d), "b2": np.zeros(d, np.float32)}


def transformer_block_apply(p, x, heads=2):
    x = x + attention(p, layer_norm(x, p["ln1"], 0.0), heads)
    h = jax.nn.gelu(layer_norm(x, p["ln2"], 0.0) @ p["w1"] + p["b1"])
    return x + h @ p["w2"] + p["b2"]


# ----------------------------------------------------------------- optimizers --
@dataclasses.dataclass(frozen=True)
class Optimizer:
    """A hand-written optimizer: init(params) -> state, update(grads, state, params) -> (params, state)."""

    init: Callable
    update: Callable


def sgd(lr=0.1):
    return Optimizer(lambda p: (), lambda g, s, p: (jax.tree.map(lambda p, g: p - lr * g, p, g), s))


def momentum(lr=0.1, beta=0.9):
    def update(g, v, p):
        v = jax.tree.map(lambda v, g: beta * v + g, v, g)
        return jax.tree.map(lambda p, v: p - lr * v, p, v), v

    return Optimizer(lambda p: jax.tree.map(np.zeros_like, p), update)


def global_norm(tree):
    return jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree.leaves(tree)))


def adam(lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0, clip_norm=None, lamb=False):
    """Adam; AdamW with weight_decay; global-norm gradient clipping with clip_norm; LAMB's
    per-tensor trust ratio with lamb=True."""

    def init(p):
        zeros = jax.tree.map(np.zeros_like, p)
        return {"count": np.zeros((), np.int32), "mu": zeros, "nu": zeros}

    def update(g, s, p):
        if clip_norm is not None:
            scale = jnp.minimum(1.0, clip_norm / (global_norm(g) + 1e-6))
            g = jax.tree.map(lambda g: g * scale, g)
        count = s["count"] + 1
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, s["mu"], g)
        nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, s["nu"], g)
        c1 = 1 - b1 ** count.astype(jnp.float32)
        c2 = 1 - b2 ** count.astype(jnp.float32)

        def step(p, m, v):
            r = (m / c1) / (jnp.sqrt(v / c2) + eps) + weight_decay * p
            if lamb:
                pn, rn = jnp.linalg.norm(p), jnp.linalg.norm(r)
                r = r * jnp.where((pn > 0) & (rn > 0), pn / rn, 1.0)
            return p - lr * r

        return jax.tree.map(step, p, mu, nu), {"count": count, "mu": mu, "nu": nu}

    return Optimizer(init, update)


OPTIMIZERS = {
    "sgd": sgd(),
    "momentum": momentum(),
    "adam": adam(),
    "adamw_clip": adam(weight_decay=0.01, clip_norm=1.0),
    "lamb": adam(weight_decay=0.01, lamb=True),
}


# ------------------------------------------------------ single-device programs --
@program("single", "2-layer tanh MLP: MSE loss, grad and an SGD update", optimizer="sgd",
         dump_passes=("algsimp", "fusion", "layout-assignment"))
def mlp_train_step():
    r = Rand("mlp_train_step")

    def loss(p, x, y):
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)

    def step(p, x, y):
        l, g = jax.value_and_grad(loss)(p, x, y)
        return jax.tree.map(lambda a, b: a - 0.1 * b, p, g), l

    p = {"w1": r.f32(16, 32), "b1": r.f32(32), "w2": r.f32(32, 4), "b2": r.f32(4)}
    return Built(step, (p, r.f32(8, 16), r.f32(8, 4)))


@program("single", "pre-LN transformer block (2-head causal attention with softmax, layer norm, GELU MLP): "
         "MSE loss, grad and an Adam update", optimizer="adam")
def transformer_block():
    r = Rand("transformer_block")
    opt = OPTIMIZERS["adam"]

    def step(p, s, x, y):
        l, g = jax.value_and_grad(lambda p: jnp.mean((transformer_block_apply(p, x) - y) ** 2))(p)
        p, s = opt.update(g, s, p)
        return p, s, l

    p = block_params(r, 16, 32)
    return Built(step, (p, opt.init(p), r.f32(2, 8, 16), r.f32(2, 8, 16)))


@program("single", "conv net: two 3x3 convs (one strided), batch norm with running statistics, relu, max and "
         "average pooling, dense head, softmax cross-entropy; SGD update", optimizer="sgd")
def convnet_bn():
    r = Rand("convnet_bn")

    def batch_norm(y, g, b, mean, var):
        mu, v = y.mean((0, 1, 2)), y.var((0, 1, 2))
        return (y - mu) * lax.rsqrt(v + 1e-5) * g + b, 0.9 * mean + 0.1 * mu, 0.9 * var + 0.1 * v

    def net(p, stats, x, labels):
        dn = ("NHWC", "HWIO", "NHWC")
        y = lax.conv_general_dilated(x, p["c1"], (1, 1), "SAME", dimension_numbers=dn)
        y, m1, v1 = batch_norm(y, p["g1"], p["b1"], *stats["bn1"])
        y = lax.reduce_window(jax.nn.relu(y), -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        y = lax.conv_general_dilated(y, p["c2"], (2, 2), "SAME", dimension_numbers=dn)
        y, m2, v2 = batch_norm(y, p["g2"], p["b2"], *stats["bn2"])
        y = jax.nn.relu(y).mean((1, 2))
        logits = y @ p["head"]
        loss = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1))
        return loss, {"bn1": (m1, v1), "bn2": (m2, v2)}

    def step(p, stats, x, labels):
        (l, stats), g = jax.value_and_grad(net, has_aux=True)(p, stats, x, labels)
        return jax.tree.map(lambda p, g: p - 0.1 * g, p, g), stats, l

    p = {"c1": r.f32(3, 3, 3, 8), "g1": np.ones(8, np.float32), "b1": np.zeros(8, np.float32),
         "c2": r.f32(3, 3, 8, 16), "g2": np.ones(16, np.float32), "b2": np.zeros(16, np.float32),
         "head": r.f32(16, 10)}
    stats = {"bn1": (np.zeros(8, np.float32), np.ones(8, np.float32)),
             "bn2": (np.zeros(16, np.float32), np.ones(16, np.float32))}
    return Built(step, (p, stats, r.f32(4, 8, 8, 3), r.i32(10, 4)))


@program("single", "mixture of experts: top-2 gating (lax.top_k + softmax), dispatch by one-hot einsum and by "
         "take_along_axis gather, 4 experts' two-layer matmuls, load-balancing loss")
def moe_layer():
    r = Rand("moe_layer")

    def moe(p, x):
        logits = x @ p["gate"]
        top, idx = lax.top_k(logits, 2)
        w = jax.nn.softmax(top, -1)
        onehot = jax.nn.one_hot(idx, p["w_in"].shape[0])  # [t, k, e]
        combine = jnp.einsum("tk,tke->te", w, onehot)
        xe = jnp.einsum("te,td->etd", (combine > 0).astype(x.dtype), x)
        ye = jnp.einsum("etf,efd->etd", jax.nn.relu(jnp.einsum("etd,edf->etf", xe, p["w_in"])), p["w_out"])
        y_einsum = jnp.einsum("te,etd->td", combine, ye)
        y_gather = (jnp.take_along_axis(ye.transpose(1, 0, 2), idx[:, :, None], 1) * w[:, :, None]).sum(1)
        aux = jnp.mean(jax.nn.softmax(logits, -1), 0) @ jnp.mean(onehot.sum(1), 0)
        return y_einsum, y_gather, aux

    p = {"gate": r.f32(16, 4), "w_in": r.f32(4, 16, 32), "w_out": r.f32(4, 32, 16)}
    return Built(moe, (p, r.f32(8, 16)))


@program("single", "lax.scan tanh RNN (with its gradient), lax.while_loop and lax.fori_loop")
def scan_while():
    r = Rand("scan_while")

    def rnn(w, u, xs):
        h, ys = lax.scan(lambda h, x: (jnp.tanh(h @ w + x @ u),) * 2, jnp.zeros(8), xs)
        return ys.sum(), h

    def f(w, u, xs):
        (l, h), g = jax.value_and_grad(rnn, has_aux=True)(w, u, xs)
        n = lax.while_loop(lambda c: c[0] < 5, lambda c: (c[0] + 1, c[1] * 1.5), (0, h))
        acc = lax.fori_loop(0, 3, lambda i, a: a + jnp.sin(a) * i, h)
        return l, g, n[1], acc

    return Built(f, (r.f32(8, 8), r.f32(4, 8), r.f32(6, 4)))


@program("single", "lax.cond on a data-dependent predicate and lax.switch over three branches")
def cond_switch():
    r = Rand("cond_switch")

    def f(i, x):
        y = lax.cond(x.sum() > 0, jnp.sin, jnp.cos, x)
        z = lax.switch(i, [jnp.exp, jnp.tanh, lambda v: v * 2], y)
        return lax.cond(i > 1, lambda a, b: (a + b, a), lambda a, b: (a * b, b), z, y)

    return Built(f, (np.int32(1), r.f32(8)))


@program("single", "jnp.sort, argsort, lax.top_k, a two-operand lax.sort keyed on the first")
def sort_topk():
    r = Rand("sort_topk")

    def f(x, v):
        return (jnp.sort(x, -1), jnp.argsort(x, -1), lax.top_k(x, 3), jnp.sort(x, 0, descending=True),
                lax.sort((x, v), num_keys=1))

    return Built(f, (r.f32(4, 10), r.i32(100, 4, 10)))


@program("single", "gathers and scatters: x[idx], x.at[idx].add/set/max, take_along_axis, dynamic_slice, "
         "dynamic_update_slice, segment_sum")
def gather_scatter():
    r = Rand("gather_scatter")

    def f(x, idx, upd, seg):
        return (x[idx], x.at[idx].add(upd), x.at[idx].set(upd), x.at[idx, 1].max(upd[:, 0]),
                jnp.take_along_axis(x[:4], idx[:, None] % 4, 1),
                lax.dynamic_slice(x, (idx[0], 0), (3, 4)), lax.dynamic_update_slice(x, upd, (idx[1], 0)),
                jax.ops.segment_sum(x, seg, num_segments=3))

    return Built(f, (r.f32(10, 4), np.array([1, 3, 3, 7], np.int32), r.f32(4, 4),
                     np.array([0, 0, 1, 1, 1, 2, 2, 0, 1, 2], np.int32)))


@program("single", "jax.random inside jit: split, fold_in, normal, uniform, bernoulli (threefry), "
         "an 'rbg' key (rng-bit-generator), and lax.rng_uniform (the rng instruction)")
def rng():
    r = Rand("rng")

    def f(key, x):
        k1, k2, k3 = jax.random.split(key, 3)
        noise = jax.random.normal(k1, x.shape)
        u = jax.random.uniform(jax.random.fold_in(k2, 7), x.shape, minval=-1.0, maxval=1.0)
        drop = jax.random.bernoulli(k3, 0.3, x.shape)
        rbg = jax.random.uniform(jax.random.key(11, impl="rbg"), x.shape)
        legacy = lax.rng_uniform(jnp.float32(0), jnp.float32(1), x.shape)
        return jnp.where(drop, x + noise, u), rbg + legacy

    return Built(f, (jax.random.key_data(jax.random.PRNGKey(0)), r.f32(4, 8)))


# --------------------------------------------------------------- collectives --
def _collectives(x, axis, n):
    """The collectives on one device's block x of shape [n, 2]."""
    s = lax.psum(x, axis)
    m = lax.pmean(x, axis)
    mx = lax.pmax(x, axis)
    g = lax.all_gather(x, axis)
    gt = lax.all_gather(x, axis, tiled=True)
    p = lax.ppermute(x, axis, [(i, (i + 1) % n) for i in range(n)])
    a2a = lax.all_to_all(x, axis, 0, 0)
    rs = lax.psum_scatter(gt, axis, tiled=True)
    return s + m + mx + p + a2a + rs + lax.axis_index(axis).astype(x.dtype), g


@program("pmap", "jax.pmap over 8 devices: psum, pmean, pmax, all_gather (stacked and tiled), ppermute ring, "
         "all_to_all, psum_scatter, axis_index", num_devices=8,
         dump_passes=("spmd-partitioning", "cpu-all-reduce-combiner", "algsimp"))
def pmap_collectives():
    r = Rand("pmap_collectives")
    return Built(lambda x: _collectives(x, "i", 8), (r.f32(8, 8, 2),), pmap_axis="i")


@program("shard_map", "jax.shard_map on a 1D mesh of 8: psum, tiled all_gather, ppermute ring, psum_scatter "
         "(tests/spmd rely on exactly these four collectives)", num_devices=8)
def shard_map_collectives():
    r = Rand("shard_map_collectives")
    m = mesh((8,), ("x",))

    def body(x):
        s = lax.psum(x, "x")
        g = lax.all_gather(x, "x", tiled=True)
        p = lax.ppermute(x, "x", [(i, (i + 1) % 8) for i in range(8)])
        return s + p + lax.psum_scatter(g, "x", tiled=True)

    f = jax.shard_map(body, mesh=m, in_specs=P("x"), out_specs=P("x"))
    return Built(f, (put(r.f32(16, 4), m, P("x")),), mesh=m)


@program("shard_map", "jax.shard_map on a 1D mesh of 8: the same collectives as pmap_collectives", num_devices=8)
def shard_map_all_collectives():
    r = Rand("shard_map_all_collectives")
    m = mesh((8,), ("x",))

    def body(x):
        y, g = _collectives(x, "x", 8)
        return y, g.reshape(64, 2)

    f = jax.shard_map(body, mesh=m, in_specs=P("x"), out_specs=(P("x"), P("x")))
    return Built(f, (put(r.f32(64, 2), m, P("x")),), mesh=m)


@program("shard_map", "jax.shard_map on a 4x2 mesh: collectives over one axis, over both axes, and a "
         "partially manual region (axis_names={'x'}, 'y' left to the partitioner)", num_devices=8)
def shard_map_collectives_2d():
    r = Rand("shard_map_collectives_2d")
    m = mesh((4, 2), ("x", "y"))

    def body(a):
        s_y = lax.psum(a, "y")
        s_xy = lax.psum(a, ("x", "y"))
        g_x = lax.all_gather(a, "x", tiled=True)  # [16, 4]
        p_y = lax.ppermute(a, "y", [(0, 1), (1, 0)])
        a2a = lax.all_to_all(a, "x", 0, 0, tiled=True)
        rs = lax.psum_scatter(g_x, "x", scatter_dimension=0, tiled=True)
        return s_y + s_xy + p_y + a2a + rs + lax.pmean(a, "y") * lax.axis_index("x"), g_x

    f = jax.shard_map(body, mesh=m, in_specs=P("x", "y"), out_specs=(P("x", "y"), P("x", "y")))

    def partial_manual(b):
        return lax.psum(b * 2, "x")

    g = jax.shard_map(partial_manual, mesh=m, in_specs=P("x"), out_specs=P(), axis_names={"x"})

    def both(a, b):
        return f(a), g(b)

    return Built(both, (put(r.f32(16, 8), m, P("x", "y")), put(r.f32(16, 8), m, P("x", "y"))), mesh=m)


# --------------------------------------------------- sharded jit (SPMD) programs --
@program("sharded", "1D mesh data-parallel MLP: batch sharded on 'data', params replicated, hidden activations "
         "constrained batch-sharded; loss and output", num_devices=8)
def sharded_dp_mlp():
    r = Rand("sharded_dp_mlp")
    m = mesh((8,), ("data",))

    def f(p, x, y):
        h = wsc(jnp.tanh(x @ p["w1"] + p["b1"]), m, P("data", None))
        out = h @ p["w2"] + p["b2"]
        return jnp.mean((out - y) ** 2), out

    p = {k: put(v, m, P()) for k, v in
         {"w1": r.f32(16, 32), "b1": r.f32(32), "w2": r.f32(32, 8), "b2": r.f32(8)}.items()}
    return Built(f, (p, put(r.f32(32, 16), m, P("data")), put(r.f32(32, 8), m, P("data"))), mesh=m)


@program("sharded", "Megatron MLP on a 4x2 mesh (data, model): column-parallel w1, relu, hidden constrained "
         "(data, model), row-parallel w2 (partial sums -> one all-reduce)", num_devices=8,
         dump_passes=("shardy-xla", "spmd-partitioning", "algsimp"))
def sharded_megatron_mlp():
    r = Rand("sharded_megatron_mlp")
    m = mesh((4, 2), ("data", "model"))

    def f(x, w1, w2):
        h = wsc(jax.nn.relu(x @ w1), m, P("data", "model"))
        return h @ w2

    return Built(f, (put(r.f32(16, 32), m, P("data", None)), put(r.f32(32, 64), m, P(None, "model")),
                     put(r.f32(64, 32), m, P("model", None))), mesh=m)


@program("sharded", "Megatron attention on a 4x2 mesh: batch on 'data', 4 heads sharded on 'model' (q/k/v "
         "column-parallel, output projection row-parallel), causal softmax, residual + layer norm", num_devices=8)
def sharded_megatron_attention():
    r = Rand("sharded_megatron_attention")
    m = mesh((4, 2), ("data", "model"))

    def f(x, wq, wk, wv, wo):
        q, k, v = (wsc(jnp.einsum("bsd,dhk->bshk", x, w), m, P("data", None, "model", None)) for w in (wq, wk, wv))
        logits = jnp.einsum("bqhk,bshk->bhqs", q, k) / np.float32(np.sqrt(8))
        logits = jnp.where(jnp.tril(jnp.ones((8, 8), bool)), logits, -1e9)
        a = wsc(jax.nn.softmax(logits, -1), m, P("data", "model", None, None))
        o = wsc(jnp.einsum("bhqs,bshk->bqhk", a, v), m, P("data", None, "model", None))
        y = wsc(jnp.einsum("bqhk,hkd->bqd", o, wo), m, P("data", None, None))
        return layer_norm(x + y, 1.0, 0.0)

    shard_in, shard_out = P(None, "model", None), P("model", None, None)
    return Built(f, (put(r.f32(4, 8, 32), m, P("data")), put(r.f32(32, 4, 8), m, shard_in),
                     put(r.f32(32, 4, 8), m, shard_in), put(r.f32(32, 4, 8), m, shard_in),
                     put(r.f32(4, 8, 32), m, shard_out)), mesh=m)


@program("sharded", "3D mesh 2x2x2 (x, y, z): einsum with operands sharded on different axes, a dimension "
         "sharded on two mesh axes (('x','y')), transpose and reduce under constraints", num_devices=8)
def sharded_3d_mesh():
    r = Rand("sharded_3d_mesh")
    m = mesh((2, 2, 2), ("x", "y", "z"))

    def f(a, w):
        h = wsc(jax.nn.relu(jnp.einsum("bsd,df->bsf", a, w)), m, P("x", None, "z"))
        s = wsc(h.sum(1), m, P(("x", "y"), "z"))
        t = wsc(h.transpose(2, 0, 1), m, P("z", "x", None))
        return s, t.max(), wsc(h, m, P(None, ("y", "z"), "x"))

    return Built(f, (put(r.f32(8, 16, 32), m, P("x", None, "y")), put(r.f32(32, 64), m, P("y", "z"))), mesh=m)


@program("sharded", "2x2x2 mesh: elementwise, transpose and reshape of a 10x6 matrix sharded 2 ways, then a "
         "matmul with a weight sharded on 'z'", num_devices=8)
def sharded_3d_uneven():
    r = Rand("sharded_3d_uneven")
    m = mesh((2, 2, 2), ("x", "y", "z"))

    def f(a, b):
        return (a * 2 + 1).T.reshape(6, 10) @ b

    return Built(f, (put(r.f32(10, 6), m, P("x", None)), put(r.f32(10, 4), m, P(None, "z"))), mesh=m)


@program("sharded", "FSDP forward on 8 devices: x rows and w rows sharded on 'data', w constrained replicated "
         "before use (one all-gather), tanh, reduce over the sharded batch", num_devices=8)
def sharded_fsdp():
    r = Rand("sharded_fsdp")
    m = mesh((8,), ("data",))

    def f(x, w):
        return jnp.tanh(x @ wsc(w, m, P())).sum(0)

    return Built(f, (put(r.f32(16, 32), m, P("data")), put(r.f32(32, 32), m, P("data"))), mesh=m)


@program("sharded", "FSDP / ZeRO-3 MLP train step on 8 devices: params sharded on 'data', constrained replicated "
         "before use (all-gather), grads constrained back to sharded (reduce-scatter), SGD update",
         num_devices=8, optimizer="sgd")
def sharded_zero3_train_step():
    r = Rand("sharded_zero3_train_step")
    m = mesh((8,), ("data",))
    shard = P("data", None)

    def loss(p, x, y):
        w1, w2 = wsc(p["w1"], m, P()), wsc(p["w2"], m, P())
        h = jax.nn.relu(x @ w1 + wsc(p["b1"], m, P()))
        return jnp.mean((h @ w2 - y) ** 2)

    def step(p, x, y):
        l, g = jax.value_and_grad(loss)(p, x, y)
        g = {k: wsc(v, m, shard if v.ndim == 2 else P("data")) for k, v in g.items()}
        p = {k: wsc(p[k] - 0.1 * g[k], m, shard if p[k].ndim == 2 else P("data")) for k in p}
        return p, l

    p = {"w1": put(r.f32(16, 64), m, shard), "b1": put(r.f32(64), m, P("data")), "w2": put(r.f32(64, 16), m, shard)}
    return Built(step, (p, put(r.f32(32, 16), m, P("data")), put(r.f32(32, 16), m, P("data"))), mesh=m)


@program("sharded", "MoE with expert sharding on a 2x4 mesh (data, expert): top-2 gating, dispatch einsum to "
         "[expert, token, d] constrained expert-sharded (all-to-all), sharded expert matmuls, combine", num_devices=8)
def sharded_moe():
    r = Rand("sharded_moe")
    m = mesh((2, 4), ("data", "expert"))

    def f(gate, w_in, w_out, x):
        top, idx = lax.top_k(x @ gate, 2)
        combine = jnp.einsum("tk,tke->te", jax.nn.softmax(top, -1), jax.nn.one_hot(idx, 4))
        xe = wsc(jnp.einsum("te,td->etd", (combine > 0).astype(x.dtype), x), m, P("expert", "data", None))
        h = jax.nn.relu(jnp.einsum("etd,edf->etf", xe, w_in))
        ye = wsc(jnp.einsum("etf,efd->etd", h, w_out), m, P("expert", "data", None))
        return wsc(jnp.einsum("te,etd->td", combine, ye), m, P("data", None))

    return Built(f, (put(r.f32(16, 4), m, P()), put(r.f32(4, 16, 32), m, P("expert")),
                     put(r.f32(4, 32, 16), m, P("expert")), put(r.f32(16, 16), m, P("data"))), mesh=m)


@program("sharded", "conv net with spatial sharding on a 2x4 mesh: batch on 'data', image height on 'spatial' "
         "(halo exchange), 3x3 SAME conv, strided conv, max pool", num_devices=8)
def sharded_conv_spatial():
    r = Rand("sharded_conv_spatial")
    m = mesh((2, 4), ("data", "spatial"))
    dn = ("NHWC", "HWIO", "NHWC")
    spec = P("data", "spatial", None, None)

    def f(x, w1, w2):
        y = wsc(jax.nn.relu(lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=dn)), m, spec)
        y = wsc(lax.conv_general_dilated(y, w2, (2, 2), "SAME", dimension_numbers=dn), m, spec)
        y = wsc(lax.reduce_window(y, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"), m, spec)
        return y, y.mean()

    return Built(f, (put(r.f32(2, 16, 16, 4), m, spec), put(r.f32(3, 3, 4, 8), m, P()),
                     put(r.f32(3, 3, 8, 8), m, P())), mesh=m)


@program("sharded", "uneven shardings on 4 devices: a 10x6 matrix constrained 4 ways on its 10 rows, a 6x5 "
         "weight on its 5 columns (inputs arrive replicated: device_put refuses uneven shardings); elementwise, "
         "matmul, reduce and transpose under constraints", num_devices=4)
def sharded_uneven():
    r = Rand("sharded_uneven")
    m = mesh((4,), ("x",))

    def f(a, b, c):
        a, b, c = wsc(a, m, P("x", None)), wsc(b, m, P(None, "x")), wsc(c, m, P("x"))
        e = jnp.exp(a) * 2 + c[:, None]
        out = wsc(e @ b, m, P("x", None))
        return out, e.sum(0), wsc(a.T, m, P("x", None)), wsc(out, m, P(None, "x"))

    return Built(f, (put(r.f32(10, 6), m, P()), put(r.f32(6, 5), m, P()), put(r.f32(10), m, P())), mesh=m)


@program("sharded", "shape ops on a 4x2 mesh under sharding constraints: elementwise, reduce over a sharded dim, "
         "transpose, reshape, slice, concatenate, pad, reverse, iota, dynamic-slice, dynamic-update-slice",
         num_devices=8)
def sharded_shape_ops():
    r = Rand("sharded_shape_ops")
    m = mesh((4, 2), ("x", "y"))

    def f(a, b, i):
        e = wsc(jnp.sin(a) * b + 1, m, P("x", "y"))
        return (
            e.sum(1),
            wsc(e.T, m, P("x", "y")),
            wsc(e.reshape(4, 32), m, P("x", None)),
            wsc(e.reshape(16, 4, 2), m, P("x", "y", None)),
            wsc(e[2:10, 1:7], m, P("x", None)),
            wsc(jnp.concatenate([a, b], axis=0), m, P("x", "y")),
            wsc(jnp.pad(a, ((1, 3), (0, 2))), m, P("x", "y")),
            wsc(jnp.flip(a, 0) + jnp.arange(16, dtype=a.dtype)[:, None], m, P("x", "y")),
            lax.dynamic_slice(e, (i, 0), (4, 8)),
            wsc(lax.dynamic_update_slice(a, b[:4], (i, 0)), m, P("x", "y")),
        )

    return Built(f, (put(r.f32(16, 8), m, P("x", "y")), put(r.f32(16, 8), m, P("x", None)), np.int32(5)), mesh=m)


# ---------------------------------------------- data-parallel training steps --
MLP_LAYERS = [(16, 32), (32, 10), (10, 6), (6, 5)]  # 10x6 and a bias of 5: not divisible by 8


def dp_mlp_model(r: Rand):
    params = {}
    for i, (a, b) in enumerate(MLP_LAYERS):
        params[f"w{i}"], params[f"b{i}"] = r.f32(a, b), r.f32(b, scale=0.1)

    def loss(p, x, y):
        h = x
        for i in range(len(MLP_LAYERS)):
            h = h @ p[f"w{i}"] + p[f"b{i}"]
            h = jnp.tanh(h) if i < len(MLP_LAYERS) - 1 else h
        return jnp.mean((h - y) ** 2)

    return params, loss, r.f32(32, 16), r.f32(32, 5)


def dp_transformer_model(r: Rand):
    vocab, seq, d = 10, 8, 16
    params = {"embed": r.f32(vocab, d), "pos": r.f32(seq, d), "block": block_params(r, d, 20),
              "ln": np.ones(d, np.float32), "head": r.f32(d, vocab)}

    def loss(p, tokens, labels):
        x = p["embed"][tokens] + p["pos"]
        x = layer_norm(transformer_block_apply(p["block"], x), p["ln"], 0.0)
        logp = jax.nn.log_softmax(x @ p["head"])
        return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], -1))

    return params, loss, r.i32(vocab, 16, seq), r.i32(vocab, 16, seq)


DP_MODELS = {"mlp": (dp_mlp_model, "4-layer tanh MLP 16-32-10-6-5"),
             "transformer": (dp_transformer_model, "1-layer transformer LM (vocab 10, d 16, 2 heads, ff 20)")}


def build_train_dp(name: str, mode: str, opt_name: str, model: str) -> Built:
    r = Rand(name)
    opt = OPTIMIZERS[opt_name]
    params, loss_fn, x, y = DP_MODELS[model][0](r)
    state = opt.init(params)

    if mode == "pmap":
        def step(p, s, x, y):
            l, g = jax.value_and_grad(loss_fn)(p, x, y)
            g, l = lax.pmean((g, l), "batch")
            p, s = opt.update(g, s, p)
            return p, s, l

        split = lambda a: a.reshape((8, a.shape[0] // 8) + a.shape[1:])  # noqa: E731
        return Built(step, (replicate(params), replicate(state), split(x), split(y)), pmap_axis="batch")

    m = mesh((8,), ("batch",))

    def step(p, s, x, y):
        l, g = jax.value_and_grad(loss_fn)(p, x, y)
        p, s = opt.update(g, s, p)
        return jax.tree.map(lambda a: wsc(a, m, P()), (p, s)) + (l,)

    rep = lambda t: jax.tree.map(lambda a: put(a, m, P()), t)  # noqa: E731
    return Built(step, (rep(params), rep(state), put(x, m, P("batch")), put(y, m, P("batch"))), mesh=m)


@program("train_dp", "jit data-parallel step on 8 devices: tanh layer 10->6 (10x6 weight, bias of 6), batch "
         "sharded, params replicated, Adam without bias correction", num_devices=8, optimizer="adam")
def train_dp_adam():
    r = Rand("train_dp_adam")
    m = mesh((8,), ("batch",))

    def step(p, opt, x, y):
        l, g = jax.value_and_grad(lambda p: jnp.mean((jnp.tanh(x @ p["w"] + p["b"]) - y) ** 2))(p)
        mu, nu = opt
        mu = jax.tree.map(lambda a, b: 0.9 * a + 0.1 * b, mu, g)
        nu = jax.tree.map(lambda a, b: 0.999 * a + 0.001 * b * b, nu, g)
        p = jax.tree.map(lambda p, a, b: p - 1e-3 * a / (jnp.sqrt(b) + 1e-8), p, mu, nu)
        return p, (mu, nu), l

    p = {"w": put(r.f32(10, 6), m, P()), "b": put(r.f32(6), m, P())}
    zeros = jax.tree.map(lambda a: put(np.zeros(a.shape, np.float32), m, P()), p)
    return Built(step, (p, (zeros, zeros), put(r.f32(32, 10), m, P("batch")), put(r.f32(32, 6), m, P("batch"))),
                 mesh=m)


TRAIN_DP = [("pmap", o, "mlp") for o in OPTIMIZERS] + [("pmap", "adam", "transformer")] + \
           [("jit", o, "mlp") for o in OPTIMIZERS] + [("jit", "adamw_clip", "transformer")]
DP_MODES = {"pmap": "pmap with lax.pmean of grads",
            "jit": "jit: batch sharded, params and optimizer state replicated"}
for _mode, _opt, _model in TRAIN_DP:
    _name = f"train_dp_{_mode}_{_opt}_{_model}"
    register(Program(
        _name, "train_dp", f"data-parallel training step on 8 devices ({DP_MODES[_mode]}), {DP_MODELS[_model][1]}, "
        f"{_opt} optimizer", functools.partial(build_train_dp, _name, _mode, _opt, _model), num_devices=8,
        optimizer=_opt,
        dump_passes=("spmd-partitioning", "cpu-all-reduce-combiner") if _name == "train_dp_jit_adamw_clip_mlp" else ()))


# ------------------------------------------------------------------- driver --
def named(fn, name):
    """fn under a new __name__, so that the module is called jit_<program>."""
    @functools.wraps(fn)
    def wrapper(*args):
        return fn(*args)

    wrapper.__name__ = wrapper.__qualname__ = name
    return wrapper


def lower(prog: Program, built: Built, shardy: bool):
    old = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", shardy)
    try:
        fn = named(built.fn, prog.name)
        if built.pmap_axis:
            return jax.pmap(fn, axis_name=built.pmap_axis).lower(*built.args)
        return jax.jit(fn).lower(*built.args)
    finally:
        jax.config.update("jax_use_shardy_partitioner", old)


def output_shardings(lowered, compiled) -> list[str] | None:
    """The HLO sharding JAX's compile chose for each output leaf, or None when one is not a
    NamedSharding.  XLA's partitioned module does not print its result sharding (JAX 0.12 drops
    it) and may tile a result finer than the program asked, so the verifier needs this to
    reassemble `P.xla_spmd.hlo`'s outputs."""
    shardings = jax.tree.leaves(compiled.output_shardings)
    infos = jax.tree.leaves(lowered.out_info)
    if not all(isinstance(s, NamedSharding) for s in shardings):
        return None
    return [str(s._to_xla_hlo_sharding(len(i.shape))) for s, i in zip(shardings, infos)]


def compile_with_dumps(prog: Program, lowered) -> tuple[str, dict[str, str], list[str] | None]:
    """Compiles; for multi-device programs and those with dump_passes also returns the dump files:
    XLA's SPMD-partitioned module and up to MAX_DUMP_FILES pass-by-pass files; for multi-device
    programs also the output shardings."""
    passes = tuple(dict.fromkeys(prog.dump_passes + (("spmd-partitioning",) if prog.num_devices > 1 else ())))
    if not passes:
        return lowered.compile().as_text(), {}, None
    with tempfile.TemporaryDirectory() as dump:
        compiled = lowered.compile(compiler_options={"xla_dump_to": dump,
                                                     "xla_dump_hlo_pass_re": "|".join(passes)})
        files = sorted(p for p in Path(dump).iterdir() if re.search(r"\.\d{4}\..*\.txt$", p.name))
        extra = {}
        spmd = [p for p in files if ".after_spmd-partitioning." in p.name]
        if prog.num_devices > 1 and spmd:
            extra[f"{prog.name}.xla_spmd.hlo"] = spmd[-1].read_text()
        picked: list[Path] = []
        for name in prog.dump_passes:  # the first run of each pass: the files before and after it
            picked += [p for p in files if (f"after_{name}." in p.name or f"before_{name}." in p.name)
                       and p not in picked][:2]
        for p in sorted(picked[:MAX_DUMP_FILES]):
            extra[f"dump/{p.name.removesuffix('.txt')}.hlo"] = p.read_text()
        return compiled.as_text(), extra, (output_shardings(lowered, compiled) if prog.num_devices > 1 else None)


def describe_args(args) -> list[dict]:
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(args)[0]:
        entry = {"path": jax.tree_util.keystr(path), "dtype": str(np.asarray(leaf).dtype) if np.isscalar(leaf)
                 else str(leaf.dtype), "shape": list(np.shape(leaf))}
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, NamedSharding):
            entry["sharding"] = str(sharding.spec)
        out.append(entry)
    return out


def meta_json(meta: dict, inputs: list[dict]) -> str:
    """meta.json text: indented, one line per input."""
    head = json.dumps(meta, indent=2)[:-2]
    rows = ",\n".join(f"    {json.dumps(i)}" for i in inputs)
    return f'{head},\n  "input_shapes": [\n{rows}\n  ]\n}}\n'


def xla_rejects(text: str) -> str | None:
    """None when XLA's own HLO parser accepts text, else its message."""
    from jax._src.lib import xla_client as xc

    try:
        xc.hlo.hlo_module_from_text(text)
    except Exception as e:  # noqa: BLE001 - XLA raises a plain runtime error
        return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return None


def make(prog: Program, out_root: Path) -> tuple[list[str], list[str]]:
    """Generates one program's files; returns (written, skipped-with-reason). Raises when the program fails."""
    built = prog.build()
    texts = {
        f"{prog.name}.lowered.shardy.hlo": lower(prog, built, True).as_text(dialect="hlo"),
        f"{prog.name}.lowered.gspmd.hlo": lower(prog, built, False).as_text(dialect="hlo"),
    }
    compiled, extra, out_shardings = compile_with_dumps(prog, lower(prog, built, True))
    texts[f"{prog.name}.compiled.hlo"] = compiled
    texts.update(extra)
    written, skipped = [], []
    accepted = {}
    for fname, text in texts.items():
        why = xla_rejects(text)
        if why is None:
            accepted[fname] = text
        else:
            skipped.append(f"{fname}: XLA's parser rejects it: {why}")
    meta = {"name": prog.name, "description": prog.description, "num_devices": prog.num_devices,
            "kind": prog.kind, "transform": "pmap" if built.pmap_axis else "jit"}
    if prog.optimizer:
        meta["optimizer"] = prog.optimizer
    if built.mesh is not None:
        meta["mesh"] = dict(built.mesh.shape)
    meta["files"] = sorted(accepted)
    if out_shardings is not None:
        meta["output_shardings"] = out_shardings

    out = out_root / prog.name
    if out.exists():
        shutil.rmtree(out)  # the folder is wholly generated: no stale dump files from an earlier run
    for fname, text in sorted(accepted.items()):
        (out / fname).parent.mkdir(parents=True, exist_ok=True)
        (out / fname).write_text(text)
        written.append(fname)
    (out / "meta.json").write_text(meta_json(meta, describe_args(built.args)))
    written.append("meta.json")
    return written, skipped


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE, help="output folder (default: golden/corpus)")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="generate only these programs")
    ap.add_argument("--list", action="store_true", help="list the programs and exit")
    args = ap.parse_args(argv)
    if args.list:
        for p in PROGRAMS.values():
            print(f"{p.name:36} {p.kind:9} {p.description}")
        return 0
    unknown = [n for n in args.only or () if n not in PROGRAMS]
    if unknown:
        ap.error(f"unknown program(s) {', '.join(unknown)}; known: {', '.join(PROGRAMS)}")
    if len(jax.devices()) < 8:
        sys.exit(f"need 8 devices, got {len(jax.devices())}: XLA_FLAGS must be set before jax is imported")
    args.out.mkdir(parents=True, exist_ok=True)
    failed, skipped_any = [], False
    start = time.perf_counter()
    for name in args.only or PROGRAMS:
        t0 = time.perf_counter()
        try:
            written, skipped = make(PROGRAMS[name], args.out)
        except Exception:  # noqa: BLE001 - report and go on with the next program
            failed.append(name)
            print(f"FAILED {name}: nothing written\n{traceback.format_exc()}", file=sys.stderr)
            continue
        print(f"{name} ({time.perf_counter() - t0:.1f}s): {', '.join(written)}")
        for s in skipped:
            skipped_any = True
            print(f"  SKIPPED {s}", file=sys.stderr)
    print(f"done in {time.perf_counter() - start:.0f}s" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed or skipped_any else 0


if __name__ == "__main__":
    sys.exit(main())
