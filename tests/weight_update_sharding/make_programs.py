"""Data-parallel training steps with real Optax optimizers, lowered for 8 devices, for the
weight-update-sharding tests (the .hlo files beside this script are its output, so the tests
need neither Flax nor Optax).

    .venv/bin/pip install optax && .venv/bin/python tests/weight_update_sharding/make_programs.py [OPT...]

(with optimizer names, only those programs are written).

Each program is an MLP 16-32-10 step (weights 16x32 and 32x10, biases 32 and 10: the 10s do
not divide by 8) in two forms:

    jit_<opt>        jax.jit, batch sharded over 8 devices, weights and optimizer state
                     replicated and returned replicated (with_sharding_constraint)
    shard_map_<opt>  jax.shard_map over 8 devices: the loss is pmean'd inside, so the gradient
                     arrives already reduced and the user's pmean of it is an all-reduce of a
                     replicated value

and `<opt>` one of the Optax updates the pass must read: SGD with momentum and Nesterov,
AdamW with a learning-rate schedule on the step counter and a weight-decay mask, AdamW and
LAMB after clip_by_global_norm (LAMB's norms are `jnp.linalg.norm`: calls), Adafactor
(factored second moments: row and column means, not elementwise; and with momentum, a first
moment of the weight's shape), `apply_every` (gradients
accumulated in state, emitted every 4th step) and `MultiSteps` around Adam (the same; its
`lax.cond` on "skip this update" folds away with the default predicate, and stays a
`conditional` around the whole update with `skip_not_finite`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

HERE = Path(__file__).resolve().parent / "programs"
LAYERS = [(16, 32), (32, 10)]


def optimizers():
    schedule = optax.warmup_cosine_decay_schedule(0.0, 1e-2, warmup_steps=10, decay_steps=100)
    return {
        "momentum": optax.sgd(0.1, momentum=0.9),
        "nesterov": optax.sgd(0.1, momentum=0.9, nesterov=True),
        "adamw_schedule_mask": optax.adamw(schedule, weight_decay=1e-2,
                                           mask=lambda p: jax.tree.map(lambda a: a.ndim > 1, p)),
        "adamw_clip": optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, weight_decay=1e-2)),
        "lamb_clip": optax.chain(optax.clip_by_global_norm(1.0), optax.lamb(1e-3, weight_decay=1e-2)),
        "adafactor": optax.adafactor(1e-2, min_dim_size_to_factor=8),
        "adafactor_momentum": optax.adafactor(1e-2, min_dim_size_to_factor=8, momentum=0.9),
        "apply_every": optax.chain(optax.apply_every(4), optax.sgd(0.1, momentum=0.9)),
        "multisteps": optax.MultiSteps(optax.adam(1e-3), every_k_schedule=4),
        "multisteps_skip": optax.MultiSteps(optax.adam(1e-3), every_k_schedule=4,
                                            should_skip_update_fn=optax.skip_not_finite),
    }


def init():
    rng = np.random.default_rng(0)
    params = {}
    for i, (a, b) in enumerate(LAYERS):
        params[f"w{i}"] = jnp.asarray(rng.normal(size=(a, b)) / np.sqrt(a), jnp.float32)
        params[f"b{i}"] = jnp.asarray(rng.normal(size=(b,)) * 0.1, jnp.float32)
    return params


def local_loss(p, x, y):
    h = jnp.tanh(x @ p["w0"] + p["b0"])
    return jnp.mean((h @ p["w1"] + p["b1"] - y) ** 2)


def programs():
    mesh = Mesh(np.array(jax.devices()[:8]), ("batch",))
    rep, batch = NamedSharding(mesh, P()), NamedSharding(mesh, P("batch"))
    params = init()
    x = jax.ShapeDtypeStruct((64, 16), jnp.float32, sharding=batch)
    y = jax.ShapeDtypeStruct((64, 10), jnp.float32, sharding=batch)
    for name, opt in optimizers().items():
        state = opt.init(params)
        spec = lambda t: jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep), t)  # noqa: E731

        def jit_step(p, s, x, y, opt=opt):
            loss, g = jax.value_and_grad(local_loss)(p, x, y)
            u, s = opt.update(g, s, p)
            p = optax.apply_updates(p, u)
            return jax.tree.map(lambda a: jax.lax.with_sharding_constraint(a, rep), (p, s)) + (loss,)

        yield f"jit_{name}", jax.jit(jit_step).lower(spec(params), spec(state), x, y)

        def body(p, s, x, y, opt=opt):
            loss, g = jax.value_and_grad(lambda p: jax.lax.pmean(local_loss(p, x, y), "batch"))(p)
            g = jax.lax.pmean(g, "batch")  # already reduced: an all-reduce of a replicated value
            u, s = opt.update(g, s, p)
            return optax.apply_updates(p, u), s, loss

        specs = (P(), P(), P("batch"), P("batch"))
        step = jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=(P(), P(), P()))
        yield f"shard_map_{name}", jax.jit(step).lower(spec(params), spec(state), x, y)


def main(only: list[str]) -> None:
    HERE.mkdir(exist_ok=True)
    jax.config.update("jax_use_shardy_partitioner", False)
    for name, lowered in programs():
        if only and not any(name.endswith(f"_{o}") for o in only):
            continue
        text = lowered.as_text(dialect="hlo")
        (HERE / f"{name}.hlo").write_text(text)
        print(f"{name}: {len(text):,} characters")


if __name__ == "__main__":
    main(sys.argv[1:])
