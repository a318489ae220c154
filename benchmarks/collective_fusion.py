"""Collective fusion on 8 virtual CPU devices: collective count, bytes and step time before and
after `collective-fusion`, next to what XLA's own CPU pipeline (which runs its all-reduce
combiner) makes of the same input.

    .venv/bin/python benchmarks/collective_fusion.py [--repeats 20]

Programs are JAX training steps (pmap over 8 devices) as XLA's SPMD partitioner emits them,
per-device programs with num_partitions=8, before XLA's optimizations:
  dp-mlp      data parallel, one pmean per gradient leaf (what a naive data-parallel step emits)
  wus-mlp     weight-update sharding: psum_scatter per leaf, update the shard, all_gather per leaf
  ar-slice    all-reduce then keep this device's slice (axis_index * shard), the pattern
              reduce-scatter-creator turns into reduce-scatters
They run as the equivalent replica_count=8 programs (hlo_passes/runtime/per_device.py).
Columns: `ours` counts our output; `xla(in)` / `xla(ours)` count what XLA's compiled
executable holds for the input / for our output; times are median wall time per step of those
two executables.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import atexit
import shutil
import tempfile

# XLA's own SPMD partitioner makes the per-device programs: its output is dumped and read back
# (into a directory removed at exit: each test run imports this module).
DUMP = Path(tempfile.mkdtemp(prefix="collective_fusion_"))
atexit.register(shutil.rmtree, DUMP, ignore_errors=True)
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
                           f" --xla_dump_to={DUMP} --xla_dump_hlo_pass_re=spmd-partitioning")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from hlo_passes.ir.opcode import Opcode  # noqa: E402
from hlo_passes.parse.module_parser import parse_module  # noqa: E402
from hlo_passes.passes.registry import lookup  # noqa: E402
from hlo_passes.printer import print_module  # noqa: E402
from hlo_passes.runtime import xla_backend  # noqa: E402
from hlo_passes.runtime.per_device import as_replica_program, compare_per_device, random_inputs  # noqa: E402

N = 8
SIZES = [(64, 128), (128,), (128, 128), (128,), (128, 64), (64,), (64, 16), (16,)]
_DONE = {Opcode.ALL_REDUCE_DONE, Opcode.ALL_GATHER_DONE, Opcode.COLLECTIVE_PERMUTE_DONE}


def _params():
    keys = jax.random.split(jax.random.PRNGKey(0), len(SIZES))
    return [jax.random.normal(k, s, jnp.float32) * 0.1 for k, s in zip(keys, SIZES)]


def _loss(params, x, y):
    h = x
    for i in range(0, len(params) - 2, 2):
        h = jnp.tanh(h @ params[i] + params[i + 1])
    logits = h @ params[-2] + params[-1]
    return jnp.mean((logits - y) ** 2)


def dp_step(params, x, y):
    grads = jax.grad(_loss)(params, x, y)
    grads = [jax.lax.pmean(g, "d") for g in grads]  # one all-reduce per leaf
    return [p - 0.1 * g for p, g in zip(params, grads)]


def wus_step(params, x, y):
    grads = jax.grad(_loss)(params, x, y)
    new = []
    for p, g in zip(params, grads):
        flat_g, flat_p = g.reshape(-1), p.reshape(-1)
        shard = jax.lax.psum_scatter(flat_g, "d", tiled=True) / N
        i = jax.lax.axis_index("d")
        mine = jax.lax.dynamic_slice(flat_p, (i * shard.shape[0],), shard.shape)
        new.append(jax.lax.all_gather(mine - 0.1 * shard, "d", tiled=True).reshape(p.shape))
    return new


def ar_slice_step(params, x, y):
    grads = jax.grad(_loss)(params, x, y)
    new = []
    for p, g in zip(params, grads):
        flat_g, flat_p = jax.lax.psum(g.reshape(-1), "d") / N, p.reshape(-1)
        k = flat_g.shape[0] // N
        i = jax.lax.axis_index("d")
        mine = jax.lax.dynamic_slice(flat_g, (i * k,), (k,))
        upd = jax.lax.dynamic_slice(flat_p, (i * k,), (k,)) - 0.1 * mine
        new.append(jax.lax.all_gather(upd, "d", tiled=True).reshape(p.shape))
    return new


PROGRAMS = {"dp-mlp": dp_step, "wus-mlp": wus_step, "ar-slice": ar_slice_step}


def partitioned(step) -> str:
    """XLA's per-device program for `step` right after its SPMD partitioner."""
    params = [jnp.broadcast_to(p, (N, *p.shape)) for p in _params()]
    x = jnp.ones((N, 32, 64), jnp.float32)
    y = jnp.ones((N, 32, 16), jnp.float32)
    seen = set(DUMP.glob("*after_spmd-partitioning*"))
    jax.pmap(step, axis_name="d").lower(params, x, y).compile()
    (path,) = [p for p in DUMP.glob("*after_spmd-partitioning*") if p not in seen]
    from hlo_passes.runtime.xla_backend import canonical_text

    # Reprinted by XLA: the dump spells multi-result calls as `%call#0`, which we do not read.
    return canonical_text(path.read_text())


def collective_stats(text: str) -> tuple[int, int]:
    """(number of collectives, bytes they produce) over all computations."""
    count = size = 0
    for instr in parse_module(text).all_instructions():
        if not instr.opcode.is_collective or instr.opcode in _DONE:
            continue
        shape = instr.shape
        if instr.opcode in (Opcode.ALL_GATHER_START, Opcode.COLLECTIVE_PERMUTE_START):
            shape = shape.elements[1]
        count += 1
        size += shape.byte_size()
    return count, size


def compile_and_time(text: str, repeats: int) -> tuple[str, float]:
    """XLA's optimized module for `text` (as its replica_count=8 program) and its median step time."""
    exe = xla_backend.compile_hlo(as_replica_program(text, N), num_replicas=N)
    return exe.optimized_text(), exe.median_step_seconds(random_inputs(text, N), repeats)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--pipeline-options", default="", help="collective-fusion options, k=v,...")
    args = ap.parse_args(argv)
    options = dict(kv.split("=") for kv in args.pipeline_options.split(",") if kv)
    options = {k.replace("-", "_"): int(v) if v.isdigit() else v for k, v in options.items()}
    header = (f"{'program':10} {'in #':>5} {'in KiB':>7} {'ours #':>6} {'ours KiB':>8} "
              f"{'xla(in) #':>9} {'xla(ours) #':>11} {'ms xla(in)':>10} {'ms xla(ours)':>12}  verified")
    print(header)
    print("-" * len(header))
    for name, step in PROGRAMS.items():
        before = partitioned(step)
        module = parse_module(before)
        lookup("collective-fusion")(**options).run(module)
        after = print_module(module)
        report = compare_per_device(before, after, num_devices=N, rtol=1e-4)
        if not report.ok:
            print(f"{name}: collective-fusion changed what the program computes\n{report.format()}")
            return 1
        n0, b0 = collective_stats(before)
        n1, b1 = collective_stats(after)
        xla_in, t_in = compile_and_time(before, args.repeats)
        xla_ours, t_ours = compile_and_time(after, args.repeats)
        print(f"{name:10} {n0:5d} {b0 / 1024:7.1f} {n1:6d} {b1 / 1024:8.1f} {collective_stats(xla_in)[0]:9d} "
              f"{collective_stats(xla_ours)[0]:11d} {t_in * 1e3:10.3f} {t_ours * 1e3:12.3f}  yes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
