"""Random JAX programs, dumped by XLA, through the CLI as users run it (differential fuzzing).

    python tests/dumps/fuzz_jax_dumps.py --seeds N --start S [--lowering shardy|gspmd|both]
                                         [--show] [--keep DIR] [--no-xla-own]

For each seed it builds a random JAX function from what real models do (matmuls and einsums with
batch dims, elementwise ops, reductions, softmax, layer norm, reshapes and transposes, concatenate,
static and dynamic slices, dynamic-update-slice, take/gather and `.at[].add`/`.max` scatters,
cumulative sums, sort/argsort/top_k, 1-D and 2-D convolutions with feature groups, lax.scan,
fori_loop and cond, jax.grad of a small loss, shard_map regions with psum/all_gather/ppermute/
psum_scatter/axis_index (fully or partially manual), with_sharding_constraint), with random shapes
(uneven against the mesh, size-1 dims), a random mesh over 8 devices (8, 2x4, 4x2, 2x2x2), random
in/out shardings and sometimes donated arguments.  A child process jits and runs it with
`XLA_FLAGS="--xla_force_host_platform_device_count=8 --xla_dump_to=DIR"` (Shardy or GSPMD
lowering), so that XLA writes every stage file, and the CLI then runs on those files as a user
does:

    before     hlo-passes run BEFORE --passes spmd-partition,weight-update-sharding,collective-fusion
                   --verify -o OUT   (the run and `hlo-passes verify BEFORE OUT` in one process)
    optimized  hlo-passes run AFTER_OPTIMIZATIONS --passes collective-fusion --verify -o OUT
    xla-own    hlo-passes verify DIR --module jit_fz_SEED (XLA's own compile of its input)

Outcomes, per check:

    ok             exit 0
    WRONG          exit 1: verify says the two programs compute different things
    CRASH          a traceback, a signal or an exit code other than 0, 1, 2
    OURS-REFUSED   exit 2 with an error, on a module XLA compiled and ran (a bug of ours too)
    XLA-fault      XLA itself failed on the original program (the child's jit, or verify's run of
                   the original); `xla-own` WRONG is listed here too (XLA's compile disagrees
                   with XLA's input, unless our verify misreads XLA's output: triage it)
    skipped        the generator built nothing runnable (a JAX tracing error: the generator's bug)

A seed reproduces with `--start SEED --seeds 1 --show --keep DIR` (the dump directory and our
outputs stay under DIR).  Exit status 1 when any check is WRONG, CRASH or OURS-REFUSED.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]
PIPELINE = "spmd-partition,weight-update-sharding,collective-fusion"
TIMEOUT = 300

MESHES = [((8,), ("a",)), ((2, 4), ("a", "b")), ((4, 2), ("a", "b")), ((2, 2, 2), ("a", "b", "c"))]
DIMS = [1, 2, 3, 4, 5, 6, 8, 8, 10, 12, 16, 16]
STEPS = {False: (3, 9), True: (8, 17)}  # ops per program (--big: longer programs)


# ------------------------------------------------------------------------------- generator ----
class Gen:
    """Builds one random program.  Every choice comes from `rng` and the shapes seen so far, so a
    dry run (under jax.eval_shape, inputs made up as zeros) and the real trace build the same
    program; the dry run learns the inputs the program asks for."""

    def __init__(self, seed: int, mesh, args=None, steps: tuple[int, int] = (3, 9)):
        import numpy as np
        self.np = np
        self.rng = np.random.default_rng(seed)
        self.mesh = mesh
        self.args = args
        self.inputs: list[tuple[tuple[int, ...], str]] = []
        self.pool: list[tuple[object, bool]] = []  # (array, exact): exact = no rounding-order effects
        self.ops: list[str] = []
        self.used: set[int] = set()  # pool entries an op has read
        self.steps = steps

    # -- helpers
    def choice(self, seq):
        return seq[int(self.rng.integers(len(seq)))]

    def coin(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def dim(self) -> int:
        return int(self.choice(DIMS))

    def input(self, shape, dtype="float32"):
        import jax.numpy as jnp
        shape = tuple(int(d) for d in shape)
        i = len(self.inputs)
        self.inputs.append((shape, dtype))
        if self.args is None:
            return jnp.zeros(shape, dtype)
        x = self.args[i]
        assert tuple(x.shape) == shape, (x.shape, shape)
        return x

    def index_input(self, shape):
        return self.input(shape, "int32")

    def push(self, x, exact: bool):
        self.pool.append((x, exact))
        return x

    def pick(self, cond=lambda x: True, exact: bool = False):
        cands = [i for i, (x, e) in enumerate(self.pool) if cond(x) and (e or not exact)]
        if not cands:
            return None, False
        i = cands[-1] if self.coin(0.5) else self.choice(cands)
        self.used.add(i)
        return self.pool[i]

    def spec(self, shape, even: bool):
        """A random PartitionSpec for `shape` over the mesh (only dividing axes when `even`)."""
        from jax.sharding import PartitionSpec as P
        axes = list(self.mesh.axis_names)
        self.rng.shuffle(axes)
        entries: list = [None] * len(shape)
        for a in axes:
            if not shape or self.coin(0.35):
                continue
            size = self.mesh.shape[a]

            def have(d):
                cur = entries[d]
                return 1 if cur is None else int(self.np.prod([self.mesh.shape[b] for b in
                                                               (cur if isinstance(cur, tuple) else (cur,))]))
            dims = [d for d in range(len(shape)) if not even or shape[d] % (have(d) * size) == 0]
            if not dims:
                continue
            d = self.choice(dims)
            cur = entries[d]
            if not even and shape[d] == 1 and self.coin(0.7):
                continue
            entries[d] = a if cur is None else (cur if isinstance(cur, tuple) else (cur,)) + (a,)
        return P(*entries)

    # -- ops: each returns False when it does not apply to the pool
    def op_unary(self):
        import jax
        import jax.numpy as jnp
        x, e = self.pick()
        f = self.choice([jnp.sin, jnp.tanh, jax.nn.relu, lambda v: v * 1.5 - 0.25, jnp.abs,
                         jax.nn.gelu, lambda v: jnp.exp(-v * v), jax.nn.sigmoid])
        self.push(f(x), e)
        return True

    def op_binary(self):
        import jax.numpy as jnp
        x, e = self.pick(lambda v: v.ndim >= 1)
        if x is None:
            return False
        y, ey = self.pick(lambda v: v.shape == x.shape and v is not x)
        if y is None or self.coin(0.4):
            shape = [1 if self.coin(0.25) else d for d in x.shape]
            y, ey = self.input(shape), True
        f = self.choice([jnp.add, jnp.multiply, jnp.subtract, jnp.maximum])
        self.push(f(x, y), e and ey)
        return True

    def op_matmul(self):
        import jax.numpy as jnp
        x, _ = self.pick(lambda v: v.ndim >= 2)
        if x is None:
            return False
        kind = self.choice(["plain", "plain", "batch", "left"])
        n = self.dim()
        if kind == "batch" and x.ndim == 3:
            b, _, k = x.shape
            w = self.input((b, k, n))
            self.push(jnp.einsum("bsk,bkn->bsn", x, w), False)
        elif kind == "left" and x.ndim == 2:
            w = self.input((x.shape[0], n))
            self.push(jnp.einsum("ki,kj->ij", x, w), False)
        else:
            w = self.input((x.shape[-1], n))
            self.push(x @ w, False)
        return True

    def op_reduce(self):
        import jax.numpy as jnp
        x, e = self.pick(lambda v: v.ndim >= 1)
        if x is None:
            return False
        axis = int(self.rng.integers(x.ndim))
        kind = self.choice(["sum", "max", "mean", "min"])
        keep = self.coin(0.4) or x.ndim == 1 and self.coin(0.7)
        f = {"sum": jnp.sum, "max": jnp.max, "mean": jnp.mean, "min": jnp.min}[kind]
        self.push(f(x, axis=axis, keepdims=keep), e and kind in ("max", "min"))
        return True

    def op_softmax(self):
        import jax
        x, _ = self.pick(lambda v: v.ndim >= 1)
        if x is None:
            return False
        self.push(jax.nn.softmax(x, axis=-1), False)
        return True

    def op_layernorm(self):
        import jax.numpy as jnp
        x, _ = self.pick(lambda v: v.ndim >= 2)
        if x is None:
            return False
        mu = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.var(x, axis=-1, keepdims=True)
        scale = self.input((x.shape[-1],))
        self.push((x - mu) / jnp.sqrt(var + 1e-5) * scale, False)
        return True

    def op_reshape(self):
        import jax.numpy as jnp
        x, e = self.pick(lambda v: v.ndim >= 1)
        if x is None:
            return False
        shape = list(x.shape)
        kind = self.choice(["merge", "split", "expand", "squeeze"])
        if kind == "merge" and len(shape) >= 2:
            i = int(self.rng.integers(len(shape) - 1))
            shape[i:i + 2] = [shape[i] * shape[i + 1]]
        elif kind == "split":
            cands = [(i, f) for i, d in enumerate(shape) for f in (2, 3, 4) if d % f == 0 and d > f]
            if not cands:
                return False
            i, f = self.choice(cands)
            shape[i:i + 1] = [f, shape[i] // f] if self.coin(0.5) else [shape[i] // f, f]
        elif kind == "squeeze" and 1 in shape:
            shape.remove(1)
        elif len(shape) < 4:
            shape.insert(int(self.rng.integers(len(shape) + 1)), 1)
        else:
            return False
        self.push(jnp.reshape(x, shape), e)
        return True

    def op_transpose(self):
        import jax.numpy as jnp
        x, e = self.pick(lambda v: v.ndim >= 2)
        if x is None:
            return False
        self.push(jnp.transpose(x, self.rng.permutation(x.ndim)), e)
        return True

    def op_concat(self):
        import jax.numpy as jnp
        x, e = self.pick(lambda v: v.ndim >= 1)
        if x is None:
            return False
        axis = int(self.rng.integers(x.ndim))
        y, ey = self.pick(lambda v: v.ndim == x.ndim and v is not x and all(
            a == b for i, (a, b) in enumerate(zip(v.shape, x.shape)) if i != axis))
        if y is None or self.coin(0.3):
            shape = list(x.shape)
            shape[axis] = self.dim()
            y, ey = self.input(shape), True
        self.push(jnp.concatenate([x, y] if self.coin(0.5) else [y, x], axis=axis), e and ey)
        return True

    def op_slice(self):
        from jax import lax
        x, e = self.pick(lambda v: v.ndim >= 1 and max(v.shape) > 1)
        if x is None:
            return False
        axis = self.choice([i for i, d in enumerate(x.shape) if d > 1])
        n = x.shape[axis]
        start = int(self.rng.integers(n))
        stop = int(self.rng.integers(start + 1, n + 1))
        stride = 1 if self.coin(0.7) else 2
        self.push(lax.slice_in_dim(x, start, stop, stride, axis=axis), e)
        return True

    def _index(self, bound: int):
        """A scalar int32 index: an input (values 0..4), or from the data (argmax of an exact
        array), or a constant."""
        import jax.numpy as jnp
        kind = self.choice(["input", "input", "argmax", "const"])
        if kind == "argmax":
            z, _ = self.pick(lambda v: v.ndim >= 1, exact=True)
            if z is not None:
                return (jnp.argmax(z.reshape(-1)) % max(bound, 1)).astype(jnp.int32)
        if kind == "const":
            return jnp.int32(int(self.rng.integers(-1, bound + 2)))
        return self.index_input(())

    def op_dynamic_slice(self):
        from jax import lax
        x, e = self.pick(lambda v: v.ndim >= 1)
        if x is None:
            return False
        axis = int(self.rng.integers(x.ndim))
        size = int(self.rng.integers(1, x.shape[axis] + 1))
        self.push(lax.dynamic_slice_in_dim(x, self._index(x.shape[axis]), size, axis=axis), e)
        return True

    def op_dynamic_update_slice(self):
        import jax.numpy as jnp
        from jax import lax
        x, e = self.pick(lambda v: v.ndim >= 1)
        if x is None:
            return False
        axis = int(self.rng.integers(x.ndim))
        size = int(self.rng.integers(1, x.shape[axis] + 1))
        shape = list(x.shape)
        shape[axis] = size
        upd = self.input(shape) if self.coin(0.5) else jnp.tanh(lax.slice_in_dim(x, 0, size, axis=axis)) * 2
        self.push(lax.dynamic_update_slice_in_dim(x, upd, self._index(x.shape[axis]), axis=axis), e)
        return True

    def op_take(self):
        import jax.numpy as jnp
        x, e = self.pick(lambda v: v.ndim >= 1)
        if x is None:
            return False
        axis = int(self.rng.integers(x.ndim))
        kind = self.choice(["take", "take", "along"])
        mode = self.choice([None, "clip", "fill"])
        if kind == "along":
            z, _ = self.pick(lambda v: v.shape == x.shape, exact=True)
            if z is None:
                idx = self.index_input(x.shape)
            else:
                idx = jnp.argsort(z, axis=axis)
            self.push(jnp.take_along_axis(x, idx, axis=axis, mode=mode), e)
        else:
            shape = (self.dim(),) if self.coin(0.7) else (self.choice([1, 2, 3]), self.choice([2, 4]))
            idx = self.index_input(shape)
            self.push(jnp.take(x, idx, axis=axis, mode=mode), e)
        return True

    def op_scatter(self):
        x, e = self.pick(lambda v: v.ndim >= 1)
        if x is None:
            return False
        m = self.choice([1, 2, 3, 4, 6, 8])
        idx = self.index_input((m,))
        kind = self.choice(["add", "add", "max", "mul"])
        if x.ndim >= 2 and self.coin(0.3):
            upd = self.input((x.shape[0], m) + x.shape[2:])
            ref = x.at[:, idx]
        else:
            upd = self.input((m,) + x.shape[1:])
            ref = x.at[idx]
        self.push(getattr(ref, kind)(upd), e and kind == "max")
        return True

    def op_cumulative(self):
        import jax.numpy as jnp
        from jax import lax
        x, e = self.pick(lambda v: v.ndim >= 1)
        if x is None:
            return False
        axis = int(self.rng.integers(x.ndim))
        if self.coin(0.7):
            self.push(jnp.cumsum(x, axis=axis), False)
        else:
            self.push(lax.cummax(x, axis=axis, reverse=self.coin(0.5)), e)
        return True

    def op_sort(self):
        import jax.numpy as jnp
        from jax import lax
        kind = self.choice(["sort", "argsort", "top_k", "sort2"])
        x, e = self.pick(lambda v: v.ndim >= 1, exact=kind != "sort")
        if x is None:
            return False
        axis = int(self.rng.integers(x.ndim))
        if kind == "sort":
            self.push(jnp.sort(x, axis=axis), e)
        elif kind == "argsort":
            self.push(jnp.argsort(x, axis=axis).astype(jnp.float32), e)
        elif kind == "sort2":
            keys, vals = lax.sort((x, jnp.tanh(x) * 3), dimension=axis, num_keys=1)
            self.push(vals, e)
        else:
            k = int(self.rng.integers(1, x.shape[-1] + 1))
            v, i = lax.top_k(x, k)
            self.push(v, e)
            self.push(i.astype(jnp.float32), e)
        return True

    def op_conv(self):
        from jax import lax
        x, _ = self.pick(lambda v: v.ndim in (3, 4))
        if x is None:
            return False
        c = x.shape[-1]
        groups = self.choice([g for g in (1, 1, 2, 3, 4) if c % g == 0])
        out = groups * self.choice([1, 2, 3])
        spatial = x.ndim - 2
        ks = [self.choice([1, 2, 3]) for _ in range(spatial)]
        padding = self.choice(["SAME", "VALID"])
        if padding == "VALID" and any(k > d for k, d in zip(ks, x.shape[1:-1])):
            padding = "SAME"
        strides = [self.choice([1, 1, 2]) for _ in range(spatial)]
        dil = [self.choice([1, 1, 2]) for _ in range(spatial)]
        if padding == "VALID" and any((k - 1) * r + 1 > d for k, r, d in zip(ks, dil, x.shape[1:-1])):
            dil = [1] * spatial
        w = self.input(tuple(ks) + (c // groups, out))
        dn = ("NWC", "WIO", "NWC") if spatial == 1 else ("NHWC", "HWIO", "NHWC")
        self.push(lax.conv_general_dilated(x, w, strides, padding, rhs_dilation=dil, dimension_numbers=dn,
                                           feature_group_count=groups), False)
        return True

    def op_scan(self):
        import jax.numpy as jnp
        from jax import lax
        x, _ = self.pick(lambda v: v.ndim >= 2)
        if x is None:
            return False
        if x.ndim == 3 and self.coin(0.6):
            t, _, d = x.shape
            ws = self.input((t, d, d))
            h0 = self.input(x.shape[1:])

            def body(h, xw):
                xi, wi = xw
                h = jnp.tanh(h @ wi + xi)
                return h, jnp.sum(h, axis=-1)
            h, ys = lax.scan(body, h0, (x, ws))
        else:
            reverse = self.coin(0.3)

            def body(h, xi):
                h = jnp.tanh(h * 0.5 + xi)
                return h, h * 2.0
            h, ys = lax.scan(body, jnp.zeros(x.shape[1:], x.dtype), x, reverse=reverse)
        self.push(h, False)
        self.push(ys, False)
        return True

    def op_fori(self):
        import jax.numpy as jnp
        from jax import lax
        x, _ = self.pick(lambda v: v.ndim >= 1)
        if x is None:
            return False
        n = int(self.rng.integers(1, 5))
        if x.ndim >= 2 and self.coin(0.5):
            w = self.input((x.shape[-1], x.shape[-1]))
            self.push(lax.fori_loop(0, n, lambda i, v: jnp.tanh(v @ w) + v * 0.1, x), False)
        else:
            self.push(lax.fori_loop(0, n, lambda i, v: v * 0.5 + jnp.sin(v) * i.astype(v.dtype), x), False)
        return True

    def op_cond(self):
        import jax.numpy as jnp
        from jax import lax
        x, e = self.pick(lambda v: v.ndim >= 1)
        if x is None:
            return False
        z, _ = self.pick(lambda v: v.ndim >= 1, exact=True)
        pred = z.reshape(-1)[0] > 0 if z is not None and self.coin(0.5) else self.index_input(()) > 2
        kind = self.coin(0.5)
        if kind:
            self.push(lax.cond(pred, jnp.sin, jnp.cos, x), e)
        else:
            self.push(lax.cond(pred, lambda v: v * 2.0, lambda v: jnp.sum(v, axis=0, keepdims=True) + v, x), False)
        return True

    def op_grad(self):
        import jax
        import jax.numpy as jnp
        x, _ = self.pick(lambda v: v.ndim >= 2)
        if x is None:
            return False
        n = self.dim()
        w = self.input((x.shape[-1], n))
        kind = self.choice(["w", "x", "both"])

        def loss(w, x):
            return jnp.mean(jnp.tanh(x @ w) ** 2)
        if kind == "w":
            self.push(jax.grad(loss)(w, x), False)
        elif kind == "x":
            self.push(jax.grad(loss, argnums=1)(w, x), False)
        else:
            gw, gx = jax.grad(loss, argnums=(0, 1))(w, x)
            self.push(w - 0.1 * gw, False)
            self.push(gx, False)
        return True

    def op_shard_map(self):
        import jax.numpy as jnp
        from jax import lax
        from jax.sharding import PartitionSpec as P
        try:
            from jax import shard_map
        except ImportError:  # older jax
            from jax.experimental.shard_map import shard_map
        names = [a for a in self.mesh.axis_names if self.mesh.shape[a] > 1]
        a = self.choice(names)
        s = self.mesh.shape[a]
        x, e = self.pick(lambda v: v.ndim >= 1 and any(d % s == 0 for d in v.shape))
        if x is None:
            return False
        d = self.choice([i for i, n in enumerate(x.shape) if n % s == 0])
        entries = [None] * x.ndim
        entries[d] = a
        in_spec = P(*entries)
        partial = len(self.mesh.axis_names) > 1 and self.coin(0.3)
        kind = self.choice(["psum", "all_gather", "ppermute", "psum_scatter", "axis_index"])
        local = x.shape[d] // s
        if kind == "psum_scatter" and local % s:
            kind = "psum"
        pre = self.choice([jnp.tanh, lambda v: v * 2.0])
        perm = [(k, (k + 1) % s) for k in range(s)] if self.coin(0.7) else [(k, s - 1 - k) for k in range(s)]

        def body(v):
            v = pre(v)
            if kind == "psum":
                return lax.psum(v, a)
            if kind == "all_gather":
                return lax.all_gather(v, a, axis=d, tiled=True)
            if kind == "ppermute":
                return lax.ppermute(v, a, perm)
            if kind == "psum_scatter":
                return lax.psum_scatter(v, a, scatter_dimension=d, tiled=True)
            return v * (lax.axis_index(a).astype(v.dtype) + 1.0)
        out_spec = P() if kind in ("psum", "all_gather") else in_spec
        kw: dict = {"axis_names": frozenset({a})} if partial else {}
        if kind == "all_gather":  # its result is the same on every device, which JAX cannot infer
            kw["check_vma"] = False
        y = shard_map(body, mesh=self.mesh, in_specs=in_spec, out_specs=out_spec, **kw)(x)
        self.push(y, e and kind in ("all_gather", "ppermute", "axis_index") and pre is not jnp.tanh)
        return True

    def op_wsc(self):
        import jax
        from jax.sharding import NamedSharding
        x, e = self.pick(lambda v: v.ndim >= 1)
        if x is None:
            return False
        self.push(jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, self.spec(x.shape, even=False))), e)
        return True

    OPS = {"unary": 3, "binary": 3, "matmul": 4, "reduce": 2, "softmax": 1, "layernorm": 1, "reshape": 2,
           "transpose": 2, "concat": 1, "slice": 1, "dynamic_slice": 1, "dynamic_update_slice": 1, "take": 1,
           "scatter": 1, "cumulative": 1, "sort": 1, "conv": 1, "scan": 1, "fori": 1, "cond": 1, "grad": 1,
           "shard_map": 2, "wsc": 3}

    def build(self):
        # the first input: rank 1-4, sometimes a conv-shaped one
        rank = self.choice([1, 2, 2, 2, 3, 3, 4])
        self.push(self.input([self.dim() for _ in range(rank)]), True)
        if self.coin(0.5):
            self.push(self.input([self.dim() for _ in range(self.choice([2, 3]))]), True)
        names = list(self.OPS)
        weights = self.np.array([self.OPS[n] for n in names], float)
        weights /= weights.sum()
        steps = int(self.rng.integers(*self.steps))
        tries = 0
        while len(self.ops) < steps and tries < 50:
            tries += 1
            name = names[int(self.rng.choice(len(names), p=weights))]
            if getattr(self, "op_" + name)():
                self.ops.append(name)
                last = self.pool[-1][0]
                if last.size > 4096 or last.ndim > 4:  # keep the programs small
                    self.pool.pop()
                    self.ops[-1] += "(dropped)"
        # the results: what no op read (most recent first, at most 4), so that little is dead
        outs = [x for i, (x, _) in reversed(list(enumerate(self.pool))) if i not in self.used][:4]
        if self.coin(0.2):
            x, _ = self.pick()
            if all(x is not o for o in outs):
                outs.append(x)
        return tuple(outs)


# ----------------------------------------------------------------------------------- child ----
def child(seed: int, lowering: str, big: bool = False) -> int:
    """Build, jit and run program `seed`; print one JSON line {phase, error, ops, ...}."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    jax.config.update("jax_use_shardy_partitioner", lowering == "shardy")
    report: dict = {"seed": seed, "lowering": lowering}

    def say(phase: str, error: str = "") -> int:
        report.update(phase=phase, error=error)
        print(json.dumps(report), flush=True)
        return 0

    rng = np.random.default_rng(10_000_000 + seed)
    shape, names = MESHES[int(rng.integers(len(MESHES)))]
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(shape), names)
    report["mesh"] = f"{dict(zip(names, shape))}"
    try:
        dry = Gen(seed, mesh, steps=STEPS[big])
        out_shapes = jax.eval_shape(lambda: dry.build())
    except Exception:
        return say("generate", traceback.format_exc(limit=-4))
    report["ops"] = dry.ops
    inputs = dry.inputs
    chooser = Gen(20_000_000 + seed, mesh)
    in_sh = [NamedSharding(mesh, chooser.spec(s, even=True) if dt == "float32" and chooser.coin(0.7)
                           else jax.sharding.PartitionSpec()) for s, dt in inputs]
    out_sh = None
    if chooser.coin(0.5):
        out_sh = tuple(NamedSharding(mesh, chooser.spec(o.shape, even=True)) for o in out_shapes)
    donate = tuple(i for i, (_, dt) in enumerate(inputs) if dt == "float32" and chooser.coin(0.3)) \
        if chooser.coin(0.3) else ()
    report["in_specs"] = [str(s.spec) for s in in_sh]
    report["out_specs"] = None if out_sh is None else [str(s.spec) for s in out_sh]
    report["donate"] = list(donate)
    data = np.random.default_rng(seed)
    args = [jax.device_put(data.uniform(-1, 1, s).astype(np.float32) if dt == "float32"
                           else data.integers(0, 5, s).astype(np.int32), sh)
            for (s, dt), sh in zip(inputs, in_sh)]

    def fz(*a):
        return Gen(seed, mesh, a, steps=STEPS[big]).build()
    fz.__name__ = fz.__qualname__ = f"fz_{seed}"
    try:
        jitted = jax.jit(fz, in_shardings=tuple(in_sh), out_shardings=out_sh, donate_argnums=donate)
        lowered = jitted.lower(*args)
    except Exception:
        return say("lower", traceback.format_exc(limit=-4))
    host_args = [np.asarray(a) for a in args]  # (before a donation deletes them)
    try:
        outs = jax.block_until_ready(lowered.compile()(*args))
    except Exception:
        return say("xla", traceback.format_exc(limit=-4))
    dump = _dump_dir()
    if dump is not None:  # what JAX computed, for the `jax` check
        np.savez(dump / "fuzz_args.npz", *host_args)
        np.savez(dump / "fuzz_outs.npz", *[np.asarray(o) for o in jax.tree.leaves(outs)])
    return say("ran")


def _dump_dir() -> Path | None:
    for flag in os.environ.get("XLA_FLAGS", "").split():
        if flag.startswith("--xla_dump_to="):
            return Path(flag.split("=", 1)[1])
    return None


def jax_check(before: Path, dump: Path) -> tuple[str, str]:
    """JAX's run of the program (XLA's compile, partitioned, on 8 devices) against `hlo-passes
    exec` of before_optimizations on the same arguments (XLA on one device, unpartitioned): a
    mismatch is XLA's partitioned compile computing something else, unless our exec misreads."""
    import re

    import numpy as np
    args, outs = dump / "fuzz_args.npz", dump / "fuzz_outs.npz"
    if not args.exists() or not outs.exists():
        return "skipped", "no saved arguments"
    text = before.read_text()
    entry = text[text.find("\nENTRY"):]
    header = entry[:entry.find("{\n")]
    used = [int(m) for m in re.findall(r"\ba_(\d+)_\.\d+:", header)]
    with np.load(args) as a:
        arrays = [a[f"arr_{i}"] for i in range(len(a.files))]
    if len(used) != header.count(": "):
        return "skipped", "parameters not named a_N_ (cannot match them to the arguments)"
    np.savez(dump / "fuzz_in.npz", *[arrays[i] for i in used])
    rc, out = _cli(["exec", str(before), "--inputs", str(dump / "fuzz_in.npz"), "--save-outputs",
                    str(dump / "fuzz_exec.npz")])
    if rc != 0:
        return classify(rc, out)
    with np.load(outs) as w, np.load(dump / "fuzz_exec.npz") as g:
        if len(w.files) != len(g.files):
            return "XLA-fault", f"JAX returned {len(w.files)} outputs, exec {len(g.files)}"
        for i in range(len(w.files)):
            want, got = g[f"arr_{i}"], w[f"arr_{i}"]
            if want.shape != got.shape:
                return "XLA-fault", f"output {i}: JAX {got.shape}, exec {want.shape}"
            if want.dtype.kind == "f":
                scale = float(np.nanmax(np.abs(want))) if want.size else 0.0
                bad = ~(np.abs(got - want) <= 1e-5 + 1e-4 * np.maximum(np.abs(want), scale))
                bad &= ~(np.isnan(want) & np.isnan(got))
            else:
                bad = want != got
            if bad.any():
                k = int(np.argmax(bad.ravel()))
                return "XLA-fault", (f"output {i}: JAX's run differs from exec of the original at flat "
                                     f"[{k}]: {got.ravel()[k]} vs {want.ravel()[k]}")
    return "ok", ""


# ---------------------------------------------------------------------------------- parent ----
@dataclass
class Result:
    seed: int
    lowering: str
    check: str
    kind: str  # ok | WRONG | CRASH | OURS-REFUSED | XLA-fault | skipped
    detail: str = ""
    files: list[str] = field(default_factory=list)


def _last_line(text: str) -> str:
    """The line that says what went wrong: an `error:` line, a BAD output, else the last one."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    telling = [ln for ln in lines if ln.startswith(("error:", "BAD ", "MISMATCH")) or "Error:" in ln]
    return (telling or lines or ["(no output)"])[-1 if not telling else 0][:300]


def _cli(argv: list[str]) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    try:
        p = subprocess.run([sys.executable, "-m", "hlo_passes", *argv], capture_output=True, text=True,
                           env=env, cwd=ROOT, timeout=TIMEOUT)
        return p.returncode, p.stderr + p.stdout[-2000:]
    except subprocess.TimeoutExpired:
        return -999, f"timed out after {TIMEOUT} s"


# What our tools print when XLA (not we) cannot compile or run the original program.
_XLA_ON_ORIGINAL = ("could not compile or run the original", "running the original", "XLA cannot run the original", "original module:",
                    "ORIGINAL:")


def classify(rc: int, out: str, *, xla_own: bool = False) -> tuple[str, str]:
    if rc == 0 and "Traceback" not in out:
        return "ok", ""
    if "Traceback" in out or rc not in (0, 1, 2):
        tb = out[out.find("Traceback"):] if "Traceback" in out else out
        return "CRASH", f"rc={rc}: " + _last_line(tb)
    if rc == 1:
        from hlo_passes.runtime.verify import NAN_LOST_BY_COLLECTIVES  # (imports no jax)
        if NAN_LOST_BY_COLLECTIVES in out:  # verify set aside every mismatch as the runtime's
            return "XLA-fault", NAN_LOST_BY_COLLECTIVES
        return ("XLA-fault" if xla_own else "WRONG"), _last_line(out)
    if "values elided" in out:  # a dump without --xla_dump_large_constants: rightly refused
        return "skipped", _last_line(out)
    if xla_own or any(s in out for s in _XLA_ON_ORIGINAL):
        return "XLA-fault", _last_line(out)
    return "OURS-REFUSED", _last_line(out)


def stage_file(directory: Path, module: str, suffix: str) -> Path | None:
    found = sorted(directory.glob(f"module_*.{module}.{suffix}"))
    return found[-1] if found else None


def run_child(seed: int, lowering: str, dump: Path, big: bool = False, xla_flags: str = "") -> dict:
    """Run `child` for program `seed` in a process of its own with XLA dumping into `dump` (made
    afresh), `xla_flags` added to the dump flags; returns its JSON report, or a `died` one."""
    shutil.rmtree(dump, ignore_errors=True)
    dump.mkdir(parents=True)
    flags = f"--xla_force_host_platform_device_count=8 --xla_dump_to={dump} {xla_flags}".rstrip()
    env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    try:
        p = subprocess.run([sys.executable, str(HERE), "--child", str(seed), "--lowering", lowering]
                           + (["--big"] if big else []),
                           capture_output=True, text=True, env=env, cwd=ROOT, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return {"phase": "died", "error": "the child timed out"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if lines:
        return json.loads(lines[-1])
    checks = [ln for ln in p.stderr.splitlines() if "Check failed" in ln or ln.startswith("F1")]
    return {"phase": "died", "error": f"rc={p.returncode}: " + (checks[0] if checks else _last_line(p.stderr))}


def run_seed(seed: int, lowering: str, work: Path, xla_own: bool = True, big: bool = False
             ) -> tuple[list[Result], dict]:
    dump = work / f"{lowering}.{seed}"
    info = run_child(seed, lowering, dump, big)
    phase = info["phase"]
    if phase in ("generate", "lower"):
        return [Result(seed, lowering, "program", "skipped", f"{phase}: " + _last_line(info["error"]))], info
    module = f"jit_fz_{seed}"
    before = stage_file(dump, module, "before_optimizations.txt")
    results = []
    if before is not None:  # (also when XLA could not compile it: a user may still run our passes)
        out = dump / "ours.before.hlo"
        rc, text = _cli(["run", str(before), "--passes", PIPELINE, "--verify", "-q", "-o", str(out)])
        kind, detail = classify(rc, text)
        results.append(Result(seed, lowering, "before", kind, detail, [str(before), str(out)]))
    if phase != "ran":
        return [Result(seed, lowering, "program", "XLA-fault", f"{phase}: " + _last_line(info["error"]),
                       [str(before)] if before else []), *results], info
    if before is None:
        return [Result(seed, lowering, "program", "skipped", "no before_optimizations dump")], info
    optimized = stage_file(dump, module, "cpu_after_optimizations.txt") or \
        stage_file(dump, module, "after_optimizations.txt")
    if optimized is not None:
        out2 = dump / "ours.optimized.hlo"
        rc, text = _cli(["run", str(optimized), "--passes", "collective-fusion", "--verify", "-q", "-o", str(out2)])
        kind, detail = classify(rc, text)
        results.append(Result(seed, lowering, "optimized", kind, detail, [str(optimized), str(out2)]))
    kind, detail = jax_check(before, dump)
    results.append(Result(seed, lowering, "jax", kind, detail, [str(before)]))
    if xla_own:
        rc, text = _cli(["verify", str(dump), "--module", module])
        kind, detail = classify(rc, text, xla_own=True)
        if kind == "XLA-fault" and rc == 2 and "error" in text and "Traceback" not in text:
            kind = "OURS-REFUSED" if "XLA" not in text else kind
        results.append(Result(seed, lowering, "xla-own", kind, detail, [str(dump)]))
    return results, info


BAD = ("WRONG", "CRASH", "OURS-REFUSED")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--lowering", choices=("shardy", "gspmd", "both"), default="both")
    ap.add_argument("--show", action="store_true", help="print the details and files of every non-ok check")
    ap.add_argument("--keep", type=Path, help="keep dump directories of non-ok seeds under this directory")
    ap.add_argument("--no-xla-own", action="store_true", help="skip `verify DIR --module` of XLA's own compile")
    ap.add_argument("--big", action="store_true", help="longer programs (8-16 ops instead of 3-8)")
    ap.add_argument("--json", type=Path, help="append every result as a JSON line here")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        return child(args.child, args.lowering, args.big)
    lowerings = ("shardy", "gspmd") if args.lowering == "both" else (args.lowering,)
    work = Path(tempfile.mkdtemp(prefix="fuzz-jax-dumps-"))
    counts: dict[tuple[str, str, str], int] = {}
    bad = 0
    try:
        for seed in range(args.start, args.start + args.seeds):
            for lowering in lowerings:
                results, info = run_seed(seed, lowering, work, xla_own=not args.no_xla_own, big=args.big)
                failed = [r for r in results if r.kind != "ok"]
                for r in results:
                    counts[(r.lowering, r.check, r.kind)] = counts.get((r.lowering, r.check, r.kind), 0) + 1
                    if args.json:
                        with args.json.open("a") as f:
                            f.write(json.dumps({**r.__dict__, "ops": info.get("ops"), "mesh": info.get("mesh")}) + "\n")
                for r in failed:
                    print(f"{r.kind:12} seed {seed} {lowering:6} {r.check:9} {r.detail}", flush=True)
                    bad += r.kind in BAD
                    if args.show:
                        print(f"    ops {info.get('ops')} mesh {info.get('mesh')} in {info.get('in_specs')} "
                              f"out {info.get('out_specs')} donate {info.get('donate')}\n    files {r.files}",
                              flush=True)
                dump = work / f"{lowering}.{seed}"
                if failed and args.keep:
                    args.keep.mkdir(parents=True, exist_ok=True)
                    shutil.copytree(dump, args.keep / dump.name, dirs_exist_ok=True)
                shutil.rmtree(dump, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for lowering in lowerings:
        for check in ("program", "before", "optimized", "jax", "xla-own"):
            row = {k[2]: v for k, v in counts.items() if k[0] == lowering and k[1] == check}
            if row:
                print(f"{lowering:6} {check:9} " + ", ".join(f"{k} {v}" for k, v in sorted(row.items())))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
