"""Real Flax + Optax training steps, for the partitioner and weight-update-sharding benchmarks.

    from benchmarks.flax_models import MODELS
    fn, args = MODELS["gpt_tp"](d=256, layers=2)   # a jitted step and ShapeDtypeStruct arguments

Flax and Optax are benchmark extras (`pip install flax optax`), not runtime dependencies.
Models (8 devices):

    gpt_tp      GPT (pre-LN blocks, flax.linen MultiHeadDotProductAttention, MLP) with Megatron
                tensor parallelism over model=4 and data parallelism over data=2, AdamW
    gpt_fsdp    the same GPT with every weight sharded over all 8 devices (FSDP), AdamW
    resnet_dp   a small ResNet with BatchNorm, data parallel over 8, SGD with momentum
    vit_2d      a ViT (patch conv + transformer blocks) on a data=4 x model=2 mesh, AdamW

Weights are annotated with flax's logical partitioning (`nn.with_logical_partitioning`), the
way real models carry shardings; inputs and optimizer state follow the weights.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


def _mesh(shape, names):
    return Mesh(np.array(jax.devices()[:math.prod(shape)]).reshape(shape), names)


def _sharded_step(model, mesh, rules, example, optimizer, loss_fn):
    """A jitted train step whose params/opt state carry the model's logical shardings mapped by
    `rules`, and ShapeDtypeStruct arguments for lowering."""
    import flax.linen as nn
    import optax  # noqa: F401 - the optimizer object comes from the caller

    abstract = jax.eval_shape(lambda: model.init(jax.random.key(0), example))
    logical = nn.get_partition_spec(abstract)
    specs = nn.logical_to_mesh(logical, rules)
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                             is_leaf=lambda x: isinstance(x, P))
    params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          nn.unbox(abstract), shardings)
    opt_abstract = jax.eval_shape(optimizer.init, params)

    def like_param(x):  # optimizer moments take their parameter's sharding; counters replicate
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, P()))

    opt_state = jax.tree.map(like_param, opt_abstract)
    flat_params = dict(jax.tree_util.tree_flatten_with_path(params)[0])
    opt_state = jax.tree_util.tree_map_with_path(
        lambda path, x: _moment_like(path, x, flat_params, mesh), opt_abstract)

    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return jax.tree.map(lambda p, u: p + u, params, updates), opt_state, loss

    return jax.jit(step), params, opt_state


def _moment_like(path, x, flat_params, mesh):
    """An optimizer-state leaf: the sharding of the parameter its path ends with, if shapes match."""
    for ppath, p in flat_params.items():
        if len(path) >= len(ppath) and tuple(path[-len(ppath):]) == tuple(ppath) and p.shape == x.shape:
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=p.sharding)
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, P()))


def _gpt(d: int, layers: int, heads: int, vocab: int):
    import flax.linen as nn

    def dense(features, names, **kw):
        return nn.Dense(features, kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), names),
                        **kw)

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.LayerNorm()(x)
            h = nn.MultiHeadDotProductAttention(
                num_heads=heads,
                kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "heads", "kv")),
                out_kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                                             ("heads", "kv", "embed")))(h, h)
            x = x + h
            h = nn.LayerNorm()(x)
            h = dense(4 * d, ("embed", "mlp"))(h)
            h = dense(d, ("mlp", "embed"))(nn.gelu(h))
            return x + h

    class GPT(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            x = nn.Embed(vocab, d, embedding_init=nn.with_logical_partitioning(
                nn.initializers.normal(0.02), ("vocab", "embed")))(tokens)
            for _ in range(layers):
                x = Block()(x)
            x = nn.LayerNorm()(x)
            return dense(vocab, ("embed", "vocab"), use_bias=False)(x)

    return GPT()


def _lm_loss(model):
    import optax

    def loss(params, batch):
        logits = model.apply(params, batch[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()
    return loss


def gpt_tp(d: int = 256, layers: int = 2, heads: int = 8, vocab: int = 512, batch: int = 8, seq: int = 64):
    import optax

    mesh = _mesh((2, 4), ("data", "model"))
    model = _gpt(d, layers, heads, vocab)
    rules = (("embed", None), ("heads", "model"), ("kv", None), ("mlp", "model"), ("vocab", "model"))
    example = jnp.zeros((batch, seq - 1), jnp.int32)
    fn, params, opt = _sharded_step(model, mesh, rules, example, optax.adamw(1e-3), _lm_loss(model))
    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32, sharding=NamedSharding(mesh, P("data", None)))
    return fn, (params, opt, tokens)


def gpt_fsdp(d: int = 256, layers: int = 2, heads: int = 8, vocab: int = 512, batch: int = 8, seq: int = 64):
    import optax

    mesh = _mesh((8,), ("fsdp",))
    model = _gpt(d, layers, heads, vocab)
    rules = (("embed", "fsdp"), ("heads", None), ("kv", None), ("mlp", None), ("vocab", None))
    example = jnp.zeros((batch, seq - 1), jnp.int32)
    fn, params, opt = _sharded_step(model, mesh, rules, example, optax.adamw(1e-3), _lm_loss(model))
    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32, sharding=NamedSharding(mesh, P("fsdp", None)))
    return fn, (params, opt, tokens)


def resnet_dp(width: int = 16, batch: int = 16, image: int = 16, classes: int = 10):
    import flax.linen as nn
    import optax

    mesh = _mesh((8,), ("data",))

    class Res(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.Conv(width, (3, 3))(x)
            for _ in range(2):
                h = nn.relu(nn.BatchNorm(use_running_average=True)(nn.Conv(width, (3, 3))(x)))
                x = x + nn.BatchNorm(use_running_average=True)(nn.Conv(width, (3, 3))(h))
            x = nn.max_pool(x, (2, 2), (2, 2))
            return nn.Dense(classes)(x.mean(axis=(1, 2)))

    model = Res()
    example = jnp.zeros((batch, image, image, 3))
    abstract = jax.eval_shape(lambda: model.init(jax.random.key(0), example))
    replicated = NamedSharding(mesh, P())
    variables = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated), abstract)
    optimizer = optax.sgd(0.1, momentum=0.9)
    opt = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated),
                       jax.eval_shape(optimizer.init, variables["params"]))

    def step(variables, opt_state, images, labels):
        def loss(params):
            logits = model.apply({**variables, "params": params}, images)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        grads = jax.grad(loss)(variables["params"])
        updates, opt_state = optimizer.update(grads, opt_state, variables["params"])
        return {**variables, "params": optax.apply_updates(variables["params"], updates)}, opt_state

    images = jax.ShapeDtypeStruct((batch, image, image, 3), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    labels = jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=NamedSharding(mesh, P("data")))
    return jax.jit(step), (variables, opt, images, labels)


def vit_2d(d: int = 128, layers: int = 2, heads: int = 4, patch: int = 4, image: int = 16, classes: int = 10,
           batch: int = 16):
    """A ViT: patch embedding (a strided conv), a class token, learned positions, pre-LN blocks
    (attention heads and MLP sharded over model=2, Megatron style), a classifier head; batch over
    data=4; AdamW."""
    import flax.linen as nn
    import optax

    mesh = _mesh((4, 2), ("data", "model"))
    tokens = (image // patch) ** 2 + 1

    def part(names, init=nn.initializers.lecun_normal()):
        return nn.with_logical_partitioning(init, names)

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.LayerNorm()(x)
            h = nn.MultiHeadDotProductAttention(
                num_heads=heads, kernel_init=part(("embed", "heads", "kv")),
                out_kernel_init=part(("heads", "kv", "embed")))(h, h)
            x = x + h
            h = nn.LayerNorm()(x)
            h = nn.Dense(4 * d, kernel_init=part(("embed", "mlp")))(h)
            h = nn.Dense(d, kernel_init=part(("mlp", "embed")))(nn.gelu(h))
            return x + h

    class ViT(nn.Module):
        @nn.compact
        def __call__(self, images):
            x = nn.Conv(d, (patch, patch), strides=(patch, patch), padding="VALID",
                        kernel_init=part((None, None, None, "embed")))(images)
            x = x.reshape(x.shape[0], -1, d)
            cls = self.param("cls", part((None, None, "embed"), nn.initializers.zeros), (1, 1, d))
            x = jnp.concatenate([jnp.broadcast_to(cls, (x.shape[0], 1, d)), x], axis=1)
            x = x + self.param("pos", part((None, None, "embed"), nn.initializers.normal(0.02)), (1, tokens, d))
            for _ in range(layers):
                x = Block()(x)
            x = nn.LayerNorm()(x[:, 0])
            return nn.Dense(classes, kernel_init=part(("embed", None)))(x)

    model = ViT()
    rules = (("embed", None), ("heads", "model"), ("kv", None), ("mlp", "model"))
    example = jnp.zeros((batch, image, image, 3))

    def loss(params, batch_):
        images, labels = batch_
        logits = model.apply(params, images)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    fn, params, opt = _sharded_step(model, mesh, rules, example, optax.adamw(1e-3), loss)
    data = (jax.ShapeDtypeStruct((batch, image, image, 3), jnp.float32, sharding=NamedSharding(mesh, P("data"))),
            jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=NamedSharding(mesh, P("data"))))
    return fn, (params, opt, data)


MODELS = {"gpt_tp": gpt_tp, "gpt_fsdp": gpt_fsdp, "resnet_dp": resnet_dp, "vit_2d": vit_2d}
