"""weight-update-sharding before/after: real Flax + Optax training steps, and the corpus's steps.

    .venv/bin/python benchmarks/weight_update_sharding.py [--repeats 30] [--only TEXT]
    .venv/bin/python benchmarks/weight_update_sharding.py --flax [--models gpt_tp,resnet_dp,vit_2d]

`--flax` (`make bench-wus`): the Flax + Optax steps of `benchmarks/flax_models.py` (GPT with
Megatron TP over model=4 and DP over data=2, AdamW; a ResNet with BatchNorm, DP over 8, SGD with
momentum; a ViT on data=4 x model=2, AdamW), lowered for 8 devices, each under three pipelines:

    spmd-partition
    spmd-partition,weight-update-sharding                                (default options: priced)
    spmd-partition,weight-update-sharding{keep-state-sharded=true}

printing per pipeline: the pass's remarks (applied / declined), collectives, bytes each device
sends into them (operand bytes) and the ring wire volume the cost model charges (all-reduce
2(g-1)/g, reduce-scatter and all-gather (g-1)/g of the buffer), XLA's HloCostAnalysis FLOPs per
device, weight + optimizer-state bytes per device (ENTRY parameters other than the batch), the
cost model's step estimate (accelerator profile), and whether it verifies numerically against
XLA's run of the unpartitioned step on 8 CPU devices.  Flax and Optax are benchmark extras.

Without `--flax`, per corpus program, side by side: per-device FLOPs of the step (hlo_passes.stats), bytes of
optimizer state each device holds (ENTRY parameters that are optimizer state, from
meta.json), bytes sent into collectives by kind, and the step's wall time on 8 virtual
CPU devices (median of repeated runs; before and after compiled and timed in the same run).

    .venv/bin/python benchmarks/weight_update_sharding.py [--repeats 30]

The programs are tiny (an MLP 16-32-10-6-5 and a one-layer transformer), so wall time is
dominated by collective latency on the CPU backend, not by the update's FLOPs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's hlo_passes, not an installed one

import numpy as np  # noqa: E402

from hlo_passes import parse_module, print_module  # noqa: E402
from hlo_passes.passes.registry import lookup  # noqa: E402
from hlo_passes.runtime import xla_backend  # noqa: E402
from hlo_passes.runtime.per_device import as_replica_program  # noqa: E402
from hlo_passes.stats import module_stats  # noqa: E402

CORPUS = Path(__file__).resolve().parents[1] / "golden" / "corpus"
N = 8

# (label, program, input form, pass options + `then`: passes run after it)
CASES = [
    ("jit sgd mlp", "train_dp_jit_sgd_mlp", "ours", {}),
    ("jit adam mlp", "train_dp_jit_adam_mlp", "ours", {}),
    ("jit adam mlp keep-state", "train_dp_jit_adam_mlp", "ours", {"keep_state_sharded": True}),
    ("jit adamw+clip mlp", "train_dp_jit_adamw_clip_mlp", "ours", {}),
    ("jit lamb mlp keep-state", "train_dp_jit_lamb_mlp", "ours", {"keep_state_sharded": True}),
    ("jit adamw+clip transformer keep-state", "train_dp_jit_adamw_clip_transformer", "ours",
     {"keep_state_sharded": True}),
    ("jit adamw+clip transformer (XLA spmd)", "train_dp_jit_adamw_clip_transformer", "xla",
     {"assume_replicated_parameters": True}),
    ("jit adam mlp keep-state + combiners", "train_dp_jit_adam_mlp", "ours",
     {"keep_state_sharded": True, "then": ("reduce-scatter-combiner", "all-gather-combiner")}),
    ("pmap adam mlp", "train_dp_pmap_adam_mlp", "xla", {"assume_replicated_parameters": True}),
    ("pmap adam transformer", "train_dp_pmap_adam_transformer", "xla", {"assume_replicated_parameters": True}),
]


def prepare(program: str, form: str):
    if form == "xla":
        return parse_module((CORPUS / program / f"{program}.xla_spmd.hlo").read_text())
    module = parse_module((CORPUS / program / f"{program}.lowered.gspmd.hlo").read_text())
    lookup("spmd-partition")(num_partitions=N).run(module)
    lookup("call-inliner")().run(module)
    return module


def state_parameters(program: str) -> list[int]:
    meta = json.loads((CORPUS / program / "meta.json").read_text())
    return [i for i, entry in enumerate(meta["input_shapes"]) if entry["path"].startswith("[1]")]


def state_bytes(module, indices: list[int]) -> int:
    params = module.entry.parameters
    return sum(params[i].shape.byte_size() for i in indices)


def median_step_ms(text: str, repeats: int) -> float:
    """Median step time of the per-device program on N devices (as its replica_count=N form),
    every device given the same positive random inputs (a replicated training state)."""
    exe = xla_backend.compile_hlo(as_replica_program(text, N), num_replicas=N)
    rng = np.random.default_rng(0)
    args = []
    for p in parse_module(text).entry.parameters:
        dtype = p.shape.element_type.numpy_dtype()
        arr = (rng.uniform(0.1, 1, p.shape.dims) if p.shape.element_type.is_float
               else rng.integers(0, 3, p.shape.dims)).astype(dtype)
        args.append([arr] * N)
    return exe.median_step_seconds(args, repeats) * 1e3


def fmt_collectives(stats) -> str:
    short = {"all-reduce": "AR", "reduce-scatter": "RS", "all-gather": "AG"}
    return " ".join(f"{short.get(k, k)}:{stats.collective_count[k]}x/{stats.collective_bytes[k]}B"
                    for k in sorted(stats.collective_count))


# ------------------------------------------------------------ Flax + Optax --
FLAX_PIPELINES = [
    ("spmd-partition", "spmd-partition"),
    ("+ weight-update-sharding", "spmd-partition,weight-update-sharding"),
    ("+ weight-update-sharding, state kept sharded",
     "spmd-partition,weight-update-sharding{keep-state-sharded=true}"),
]


def flax_rows(names: list[str]) -> None:
    """Each Flax model under each pipeline of FLAX_PIPELINES, printed as a Markdown table."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import jax

    import flax_models  # benchmark extras: flax, optax
    from hlo_passes.passes.pipeline import parse_pipeline, set_option_everywhere
    from hlo_passes.passes.spmd.cost_model import DEFAULT, module_estimate
    from hlo_passes.runtime import verify_equivalent
    from hlo_passes.runtime.lowered import lowered_as_compiled
    from hlo_passes.runtime.xla_backend import cost_analysis

    print("| model | pipeline | pass remarks | collectives | bytes sent/device | wire bytes/device | "
          "FLOPs/device | weights + state B/device | est. µs | verified |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        fn, fargs = flax_models.MODELS[name]()
        lowered = lowered_as_compiled(fn.lower(*fargs))  # the flags JAX compiles with (outputs left sharded)
        held_leaves = len(jax.tree.leaves(fargs[:2]))  # every model's step takes (weights, opt state, batch...)
        for label, passes in FLAX_PIPELINES:
            module = parse_module(lowered)
            pipeline = parse_pipeline(passes)
            set_option_everywhere(pipeline, "num_partitions", N)
            remarks = []
            for p in pipeline.passes:
                p.run(module)
                if p.name == "weight-update-sharding":
                    remarks = p.remarks
            text = print_module(module)
            stats = module_stats(module)
            estimate = module_estimate(module, DEFAULT)
            held = sum(p.shape.byte_size() for p in module.entry.parameters[:held_leaves])
            applied = sum(r.kind == "applied" for r in remarks)
            missed = sum(r.kind == "missed" for r in remarks)
            said = f"{applied} applied, {missed} declined" if remarks else "-"
            report = verify_equivalent(lowered, text)
            print(f"| {name} | {label} | {said} | {fmt_collectives(stats)} | "
                  f"{sum(stats.collective_bytes.values()):,} | {estimate.bytes:,} | "
                  f"{int(cost_analysis(text).get('flops', 0)):,} | {held:,} | "
                  f"{estimate.step_seconds(DEFAULT.profile) * 1e6:.1f} | {'yes' if report.ok else 'NO'} |",
                  flush=True)
            if not report.ok:
                print(report.format(), file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--only", metavar="TEXT", help="run only the cases whose label contains TEXT")
    ap.add_argument("--flax", action="store_true", help="the Flax + Optax models instead of the corpus")
    ap.add_argument("--models", default="gpt_tp,resnet_dp,vit_2d", help="with --flax: which models")
    args = ap.parse_args()
    if args.flax:
        flax_rows(args.models.split(","))
        return
    from hlo_passes.passes.weight_update_sharding.weight_update_sharding import WeightUpdateSharding

    rows = []
    for label, program, form, options in CASES:
        if args.only and args.only not in label:
            continue
        before = prepare(program, form)
        after = parse_module(print_module(before))
        options = dict(options)
        then = options.pop("then", ())
        WeightUpdateSharding(**options).run(after)
        for name in then:
            lookup(name)().run(after)
        indices = state_parameters(program)
        sb, sa = module_stats(before), module_stats(after)
        tb, ta = median_step_ms(print_module(before), args.repeats), median_step_ms(print_module(after), args.repeats)
        rows.append((label, sb.flops, sa.flops, state_bytes(before, indices), state_bytes(after, indices),
                     fmt_collectives(sb), fmt_collectives(sa), tb, ta))

    print("| program | FLOPs/device before → after | optimizer state B/device before → after | "
          "collectives before (count/bytes sent per device) | after | step ms before → after (ratio) |")
    print("|---|---|---|---|---|---|")
    for label, fb, fa, stb, sta, cb, ca, tb, ta in rows:
        print(f"| {label} | {fb:,} → {fa:,} | {stb:,} → {sta:,} | {cb} | {ca} | "
              f"{tb:.3f} → {ta:.3f} ({ta / tb:.2f}x) |")


if __name__ == "__main__":
    main()
