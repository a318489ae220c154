"""Regenerates examples/dp_mlp_step.hlo: XLA's per-device program (right after its
SPMD partitioner) of a pmap data-parallel MLP training step on 8 devices, with
one gradient all-reduce (pmean) per weight and bias."""

import glob
import os
import sys
import tempfile
from pathlib import Path

dump = tempfile.mkdtemp()
os.environ["XLA_FLAGS"] = (f"--xla_force_host_platform_device_count=8 --xla_dump_to={dump} "
                           "--xla_dump_hlo_pass_re=spmd-partitioning")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hlo_passes.runtime.hlo_proto import canonical_text  # noqa: E402


def loss(ps, x, y):
    h = x
    for i in range(0, len(ps) - 2, 2):
        h = jnp.tanh(h @ ps[i] + ps[i + 1])
    return jnp.mean((h @ ps[-2] + ps[-1] - y) ** 2)


def step(ps, x, y):
    g = jax.grad(loss)(ps, x, y)
    g = [jax.lax.pmean(a, "batch") for a in g]
    return [p - 0.05 * a for p, a in zip(ps, g)]


dims = [32, 64, 64, 10]
ps = []
for a, b in zip(dims[:-1], dims[1:]):
    ps += [jnp.ones((8, a, b)) * 0.01, jnp.zeros((8, b))]
x, y = jnp.ones((8, 16, 32)), jnp.ones((8, 16, 10))
jax.pmap(step, axis_name="batch").lower(ps, x, y).compile()
(after,) = glob.glob(f"{dump}/*after_spmd-partitioning*")
# XLA reprints the dump canonically (the dump spells some operands as %call#0).
text = canonical_text(Path(after).read_text())
Path(__file__).with_name("dp_mlp_step.hlo").write_text(text)
