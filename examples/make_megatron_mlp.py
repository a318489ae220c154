"""Regenerate examples/megatron_mlp.hlo: a Megatron-style 2-layer MLP (column-parallel then
row-parallel, biases, gelu) on a 4x2 (data, model) mesh, lowered by JAX with its shardings
(GSPMD form, with op metadata so remarks and inserted collectives point at this file).

    .venv/bin/python examples/make_megatron_mlp.py
"""

import os
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402


def main() -> None:
    jax.config.update("jax_use_shardy_partitioner", False)
    mesh = jax.make_mesh((4, 2), ("data", "model"), devices=jax.devices()[:8],
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)

    def mlp(x, w1, b1, w2, b2):
        h = jax.nn.gelu(x @ w1 + b1)                      # column-parallel: hidden dim over "model"
        h = jax.lax.with_sharding_constraint(h, NamedSharding(mesh, P("data", "model")))
        y = h @ w2 + b2                                   # row-parallel: partial sums over "model"
        return jax.lax.with_sharding_constraint(y, NamedSharding(mesh, P("data", None)))

    rng = np.random.default_rng(0)
    arg = lambda shape, spec: jax.device_put(  # noqa: E731
        jnp.asarray(rng.uniform(-1, 1, shape), jnp.float32), NamedSharding(mesh, spec))
    args = (arg((16, 32), P("data", None)), arg((32, 64), P(None, "model")), arg((64,), P("model")),
            arg((64, 32), P("model", None)), arg((32,), P()))
    lowered = jax.jit(mlp).lower(*args)
    text = lowered.as_text(dialect="hlo", debug_info=True)
    here = Path(__file__).resolve()
    text = text.replace(str(here), f"examples/{here.name}")  # no machine-specific paths
    here.with_name("megatron_mlp.hlo").write_text(text)


if __name__ == "__main__":
    main()
