"""Our pass times beside XLA's own times for the same passes on the same file, in one run.

    .venv/bin/python benchmarks/pass_speed.py [--quick] [--layers 12,24] [--devices 8,256]
        [--only REGEX] [--timeout SECONDS] [--passes PIPELINE]

The inputs are training steps generated with JAX itself (`jax.jit(step).lower(shapes with
shardings).as_text(dialect="hlo")`, the text our partitioner tests read) and cached under
bench-data/speed/:

    gpt{L}-{unrolled|scanned}-{tp|fsdp}-{gspmd|shardy}
        a decoder-only transformer step (embedding, L blocks of attention + MLP with dropout,
        tied unembedding, cross-entropy, Adam), its blocks a Python loop or a `lax.scan` over
        stacked parameters; Megatron TP + DP on a data=2 x model=4 mesh, or FSDP over 8
        devices; lowered by JAX in GSPMD or Shardy form.  Small tensors: instruction count is
        what costs us time, not tensor size.
    flax-gpt{L}-{tp|fsdp}-{gspmd|shardy}
        a real Flax + Optax step (`benchmarks/flax_models.py`: Flax's attention, LayerNorm and
        Dense modules, AdamW), unrolled, d_model 64 and 8 heads: Megatron TP + DP (data=2 x
        model=4) or FSDP over 8 devices, the kind of file the held-out measurement used (its
        24-layer step: 2.0 MB, 24k instructions).  Needs the benchmark extras flax and optax.
    mlp8-dev{N}
        one 8-layer Megatron MLP step (d=1024, f=4096, 8 rows per data shard) on a data x
        model(8) mesh of N devices: the same program at every device count.

JAX compiles a jit whose outputs have no sharding with `allow_spmd_sharding_propagation_to_output`,
so the generated header carries that flag and both partitioners get it.

Each measurement is a child process of its own, bounded by --timeout, so that a slow or
failing one is a row in the table rather than the end of the run:
  * ours: the pipeline (default spmd-partition,weight-update-sharding,collective-fusion) through
    `PassManager`; per pass its CPU and wall seconds, the process's peak RSS, and the printed
    module's size and collective count after it;
  * XLA's: `xla_backend.pass_times` (XLA's own per-pass log of one compile), beside ours as
    spmd-partition ~ sharding-propagation + shardy-xla + spmd-partitioning (the latter
    includes its cleanup), collective-fusion ~ XLA's *combiner passes; weight-update-sharding
    has no XLA CPU counterpart.  XLA's module after spmd-partitioning (`pass_dump`) gives its
    output size and collective count.

The figures are printed, not judged: this is not part of CI (`make bench-speed`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT / "bench-data" / "speed"
FULL_PIPELINE = "spmd-partition,weight-update-sharding,collective-fusion"
LAYERS = (12, 24, 48, 96)
DEVICES = (8, 256, 2048, 4096)
QUICK = ["gpt12-unrolled-tp-gspmd", "gpt24-unrolled-tp-gspmd", "mlp8-dev8", "mlp8-dev256"]
# Which XLA passes do the work of one of ours (XLA's names, as its pass log spells them).
XLA_COUNTERPARTS = {
    "spmd-partition": lambda name: name in ("sharding-propagation", "shardy-xla", "spmd-partitioning"),
    "collective-fusion": lambda name: name.endswith("combiner"),
}


# ================================================================ models ==
# Run only in generator children (`--generate NAME`), whose XLA_FLAGS fix the device count.
D, HEADS, FF, SEQ, BATCH, VOCAB = 64, 4, 256, 32, 8, 512


def gpt_step(layers: int, scanned: bool, layout: str):
    """(jitted step, argument shapes with shardings) for the transformer training step."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    auto = jax.sharding.AxisType.Auto
    if layout == "tp":
        mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(auto, auto))
        batch, col, row, vec = ("data",), (None, "model"), ("model", None), ("model",)
        embed = (None, None)
    else:  # fsdp: every weight's first dim over all 8 devices, the batch too
        mesh = jax.make_mesh((8,), ("fsdp",), axis_types=(auto,))
        batch, col, row, vec = ("fsdp",), ("fsdp", None), ("fsdp", None), (None,)
        embed = ("fsdp", None)
    block_specs = {"ln1_g": (None,), "ln1_b": (None,), "ln2_g": (None,), "ln2_b": (None,),
                   "wq": col, "wk": col, "wv": col, "wo": row, "w1": col, "w2": row,
                   "bq": vec, "bk": vec, "bv": vec, "b1": vec, "b2": (None,)}
    block_shapes = {"ln1_g": (D,), "ln1_b": (D,), "ln2_g": (D,), "ln2_b": (D,), "wq": (D, D), "wk": (D, D),
                    "wv": (D, D), "wo": (D, D), "w1": (D, FF), "w2": (FF, D), "bq": (D,), "bk": (D,),
                    "bv": (D,), "b1": (FF,), "b2": (D,)}

    def spec(shape, names, dtype=jnp.float32):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P(*names)))

    def layer_norm(x, g, b):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(v + 1e-5) * g + b

    def dropout(key, x, rate=0.1):
        return jnp.where(jax.random.bernoulli(key, 1 - rate, x.shape), x / (1 - rate), 0)

    def block(p, x, key):
        k1, k2 = jax.random.split(key)
        h = layer_norm(x, p["ln1_g"], p["ln1_b"])
        q, k, v = (jnp.einsum("bsd,dh->bsh", h, p[n]) + p["b" + n[1]] for n in ("wq", "wk", "wv"))
        q, k, v = (t.reshape(BATCH, SEQ, HEADS, D // HEADS) for t in (q, k, v))
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(D // HEADS)
        logits = jnp.where(jnp.tril(jnp.ones((SEQ, SEQ), bool)), logits, -1e9)
        att = dropout(k1, jax.nn.softmax(logits, axis=-1))
        o = jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(BATCH, SEQ, D)
        x = x + jnp.einsum("bsh,hd->bsd", o, p["wo"])
        h = layer_norm(x, p["ln2_g"], p["ln2_b"])
        h = jax.nn.gelu(jnp.einsum("bsd,df->bsf", h, p["w1"]) + p["b1"])
        return x + dropout(k2, jnp.einsum("bsf,fd->bsd", h, p["w2"]) + p["b2"])

    def loss(params, tokens, targets, key_data):
        key = jax.random.wrap_key_data(key_data)
        x = params["embed"][tokens]
        if scanned:
            def body(x, layer):
                p, i = layer
                return block(p, x, jax.random.fold_in(key, i)), None
            x, _ = jax.lax.scan(body, x, (params["blocks"], jnp.arange(layers)))
        else:
            for i, p in enumerate(params["blocks"]):
                x = block(p, x, jax.random.fold_in(key, i))
        logits = jnp.einsum("bsd,vd->bsv", layer_norm(x, params["lnf_g"], params["lnf_b"]), params["embed"])
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()

    def step(params, m, v, tokens, targets, key_data):
        value, g = jax.value_and_grad(loss)(params, tokens, targets, key_data)
        m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
        v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, v, g)
        params = jax.tree.map(lambda p, m, v: p - 1e-3 * m / (jnp.sqrt(v) + 1e-8), params, m, v)
        return params, m, v, value

    if scanned:  # one stacked array per parameter kind, its leading dim over the layers
        blocks = {k: spec((layers,) + s, (None,) + block_specs[k]) for k, s in block_shapes.items()}
    else:
        blocks = [{k: spec(s, block_specs[k]) for k, s in block_shapes.items()} for _ in range(layers)]
    params = {"embed": spec((VOCAB, D), embed), "lnf_g": spec((D,), (None,)), "lnf_b": spec((D,), (None,)),
              "blocks": blocks}
    tokens = spec((BATCH, SEQ), batch + (None,), jnp.int32)
    return jax.jit(step), (params, params, params, tokens, tokens, spec((2,), (None,), jnp.uint32))


def megatron_mlp_step(devices: int, layers: int = 8, d: int = 1024, f: int = 4096):
    """The device-scaling model: an MLP step on a data x model(8) mesh; 8 rows per data shard,
    w1 column-split and w2 row-split over 'model' (Megatron), SGD."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    auto = jax.sharding.AxisType.Auto
    mesh = jax.make_mesh((devices // 8, 8), ("data", "model"), axis_types=(auto, auto))

    def spec(shape, *names):
        return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, P(*names)))

    def loss(ws, x):
        for w1, w2 in ws:
            x = x + jax.nn.relu(x @ w1) @ w2
        return jnp.mean(x ** 2)

    def step(ws, x):
        g = jax.grad(loss)(ws, x)
        return jax.tree.map(lambda w, g: w - 1e-3 * g, ws, g)

    ws = [(spec((d, f), None, "model"), spec((f, d), "model", None)) for _ in range(layers)]
    return jax.jit(step), (ws, spec((8 * (devices // 8), d), "data", None))


def flax_gpt_step(layers: int, layout: str):
    """A Flax + Optax GPT step (`flax_models.gpt_tp` / `gpt_fsdp`) with `layers` blocks."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import flax_models  # needs flax and optax (benchmark extras)

    build = flax_models.gpt_tp if layout == "tp" else flax_models.gpt_fsdp
    return build(d=D, layers=layers, heads=8)


def model_names(layers, devices) -> list[str]:
    names = [f"gpt{n}-{kind}-{layout}-{lowering}" for lowering in ("gspmd", "shardy") for layout in ("tp", "fsdp")
             for n in layers for kind in ("unrolled", "scanned")]
    names += [f"flax-gpt{n}-{layout}-{lowering}" for lowering in ("gspmd", "shardy") for layout in ("tp", "fsdp")
              for n in layers]
    return names + [f"mlp8-dev{n}" for n in devices]


def parse_name(name: str) -> dict:
    """What a model name asks for: {'devices', 'shardy', 'build': (function, args)}."""
    m = re.fullmatch(r"gpt(\d+)-(unrolled|scanned)-(tp|fsdp)-(gspmd|shardy)", name)
    if m:
        return {"devices": 8, "shardy": m[4] == "shardy",
                "build": (gpt_step, (int(m[1]), m[2] == "scanned", m[3]))}
    m = re.fullmatch(r"flax-gpt(\d+)-(tp|fsdp)-(gspmd|shardy)", name)
    if m:
        return {"devices": 8, "shardy": m[3] == "shardy", "build": (flax_gpt_step, (int(m[1]), m[2]))}
    m = re.fullmatch(r"mlp8-dev(\d+)", name)
    if m:
        return {"devices": int(m[1]), "shardy": False, "build": (megatron_mlp_step, (int(m[1]),))}
    raise SystemExit(f"unknown model {name!r}")


def generate(name: str) -> None:
    """(child) Lower model `name` with JAX and write bench-data/speed/NAME.hlo."""
    import jax

    spec = parse_name(name)
    jax.config.update("jax_use_shardy_partitioner", spec["shardy"])
    build, args = spec["build"]
    fn, fargs = build(*args)
    text = fn.lower(*fargs).as_text(dialect="hlo")
    # JAX compiles a jit whose outputs carry no sharding with this flag (one entry: all outputs).
    header, rest = text.split("\n", 1)
    text = f"{header}, allow_spmd_sharding_propagation_to_output={{true}}\n{rest}"
    DATA.mkdir(parents=True, exist_ok=True)
    tmp = DATA / f"{name}.hlo.tmp"
    tmp.write_text(text)
    tmp.rename(DATA / f"{name}.hlo")


# ============================================================ measuring ==
def measure_ours(path: str, pipeline: str, num_partitions: int) -> None:
    """(child) Run `pipeline` on the file; one JSON line per event on stdout, flushed as it
    happens, so that a run cut off by the timeout still reports the passes it finished."""
    from hlo_passes.parse.module_parser import parse_module
    from hlo_passes.passes.manager import PassManager
    from hlo_passes.passes.pipeline import parse_pipeline, set_option_everywhere
    from hlo_passes.printer import print_module
    from hlo_passes.stats import module_stats

    def emit(**event):
        print(json.dumps(event), flush=True)

    start = time.process_time()
    module = parse_module(Path(path).read_text(), path)
    emit(kind="parsed", cpu=time.process_time() - start)
    passes = parse_pipeline(pipeline)
    set_option_everywhere(passes, "num_partitions", num_partitions)

    def after_each(index, p, mod, changed):
        record = manager.records[-1]
        text = print_module(mod)  # outside the pass's timer
        emit(kind="pass", name=p.name, cpu=record.cpu_seconds, wall=record.seconds,
             peak=record.peak_memory_bytes, out_bytes=len(text.encode()),
             collectives=sum(module_stats(mod).collective_count.values()))

    manager = PassManager(passes.passes, after_each=after_each)
    try:
        manager.run(module)
    except Exception as e:  # reported as the table's row for the pass that failed
        emit(kind="failed", name=manager.failed_pass or "?", error=f"{type(e).__name__}: {e}"[:300])


def measure_xla_output(path: str, num_partitions: int, shardy: bool) -> None:
    """(child) XLA's module after spmd-partitioning: its size and collective count, as JSON."""
    from hlo_passes.parse.module_parser import parse_module
    from hlo_passes.runtime.xla_backend import pass_dump, quiet_cpp_logs
    from hlo_passes.stats import module_stats

    quiet_cpp_logs()
    text = Path(path).read_text()
    out = pass_dump(text, "spmd-partitioning", num_partitions=num_partitions, shardy=shardy,
                    propagate_to_output=(True,))
    collectives = sum(module_stats(parse_module(out)).collective_count.values())
    print(json.dumps({"out_bytes": len(out.encode()), "collectives": collectives}))


# =============================================================== parent ==
@dataclass
class Row:
    """One of our passes on one file, and XLA's counterpart."""

    name: str
    cpu: float | None = None
    wall: float | None = None
    peak: int | None = None
    out_bytes: int | None = None
    collectives: int | None = None
    note: str = ""


@dataclass
class FileResult:
    name: str
    instructions: int
    devices: int
    rows: list[Row] = field(default_factory=list)
    xla_times: dict[str, float] | None = None
    xla_note: str = ""
    xla_out: dict | None = None


def child(argv: list[str], devices: int, timeout: float) -> tuple[str, str]:
    """Run this script in a child (XLA_FLAGS giving `devices` CPU devices); (stdout, problem)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    try:
        done = subprocess.run([sys.executable, __file__, *argv], env=env, capture_output=True, text=True,
                              timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return out, f"timeout {timeout:.0f}s"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return done.stdout, f"exit {done.returncode}: {last[:120]}"
    return done.stdout, ""


def count_instructions(text: str) -> int:
    return len(re.findall(r"^\s+(?:ROOT )?\S+ = ", text, re.M))


def run_file(name: str, pipeline: str, timeout: float) -> FileResult | str:
    from hlo_passes.runtime.xla_backend import BackendUnavailable, pass_times

    spec = parse_name(name)
    n = spec["devices"]
    path = DATA / f"{name}.hlo"
    if not path.exists():
        print(f"  generating {name} ...", file=sys.stderr, flush=True)
        _, problem = child(["--generate", name], n, timeout)
        if problem:
            return f"generating failed ({problem})"
    text = path.read_text()
    result = FileResult(name, count_instructions(text), n)

    print(f"  {name}: ours ...", file=sys.stderr, flush=True)
    out, problem = child(["--ours", str(path), "--passes", pipeline, "--num-partitions", str(n)], n, timeout)
    seen = set()
    for line in out.splitlines():
        event = json.loads(line)
        if event["kind"] == "pass":
            seen.add(event["name"])
            result.rows.append(Row(event["name"], event["cpu"], event["wall"], event["peak"],
                                   event["out_bytes"], event["collectives"]))
        elif event["kind"] == "failed":
            seen.add(event["name"])
            result.rows.append(Row(event["name"], note=f"FAILED {event['error']}"))
    for p in pipeline.split(","):
        name_only = p.split("{")[0]
        if name_only not in seen:
            result.rows.append(Row(name_only, note=problem or "not run"))
            problem = "not run"  # the passes after the one cut off never started

    print(f"  {name}: XLA ...", file=sys.stderr, flush=True)
    try:
        result.xla_times = pass_times(text, num_partitions=n, shardy=spec["shardy"], propagate_to_output=(True,),
                                      timeout=timeout)
    except subprocess.TimeoutExpired:
        result.xla_note = f"timeout {timeout:.0f}s"
    except BackendUnavailable as e:
        result.xla_note = str(e)[:200]
    out, problem = child(["--xla-output", str(path), "--num-partitions", str(n)]
                         + (["--shardy"] if spec["shardy"] else []), n, timeout)
    result.xla_out = json.loads(out) if out.strip() and not problem else None
    return result


def _fmt(value, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def print_header() -> None:
    print(f"{'file':26} {'instr':>7} {'dev':>5} {'pass':22} {'ours cpu s':>10} {'wall s':>8} {'XLA s':>8} "
          f"{'x XLA':>7} {'s/1k instr':>10} {'peak MiB':>8} {'out KB':>8} {'XLA KB':>8} {'coll':>5} {'XLA':>5}",
          flush=True)


def print_result(result: FileResult | str, name: str) -> None:
    if isinstance(result, str):
        print(f"{name:26} {result}", flush=True)
        return
    xla_out = result.xla_out or {}
    for i, row in enumerate(result.rows):
        counterpart = XLA_COUNTERPARTS.get(row.name)
        xla_s = None
        if result.xla_times is not None and counterpart is not None:
            xla_s = sum(s for p, s in result.xla_times.items() if counterpart(p)) or None
        ratio = row.cpu / xla_s if row.cpu is not None and xla_s else None
        per_k = row.cpu / (result.instructions / 1000) if row.cpu is not None and result.instructions else None
        first = i == 0
        partitioned = row.name == "spmd-partition"  # XLA's output is its module after partitioning
        cells = [f"{result.name if first else '':26}", f"{result.instructions if first else '':>7}",
                 f"{result.devices if first else '':>5}", f"{row.name:22}", f"{_fmt(row.cpu, '.2f'):>10}",
                 f"{_fmt(row.wall, '.2f'):>8}",
                 f"{_fmt(xla_s, '.3f', ('timeout' if 'timeout' in result.xla_note else 'failed') if counterpart else '-'):>8}",
                 f"{_fmt(ratio, '.1f'):>7}", f"{_fmt(per_k, '.3f'):>10}",
                 f"{_fmt(row.peak / 2**20 if row.peak else None, '.0f'):>8}",
                 f"{_fmt(row.out_bytes / 1000 if row.out_bytes else None, '.0f'):>8}",
                 f"{_fmt(xla_out.get('out_bytes', 0) / 1000 if partitioned and xla_out else None, '.0f'):>8}",
                 f"{_fmt(row.collectives, 'd'):>5}",
                 f"{_fmt(xla_out.get('collectives') if partitioned else None, 'd'):>5}"]
        line = " ".join(cells)
        if row.note:
            line += f"  [{row.note}]"
        print(line, flush=True)
    if result.xla_note:
        print(f"{'':26} XLA: {result.xla_note}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only " + ", ".join(QUICK))
    ap.add_argument("--layers", default=",".join(map(str, LAYERS)), help="transformer depths (default %(default)s)")
    ap.add_argument("--devices", default=",".join(map(str, DEVICES)),
                    help="device counts of the scaling model (default %(default)s)")
    ap.add_argument("--only", metavar="REGEX", help="only the models whose name matches (re.search)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per child process (default %(default)s)")
    ap.add_argument("--passes", default=FULL_PIPELINE, help="our pipeline (default %(default)s)")
    ap.add_argument("--list", action="store_true", help="print the model names and stop")
    # the children's entry points
    ap.add_argument("--generate", metavar="NAME", help=argparse.SUPPRESS)
    ap.add_argument("--ours", metavar="FILE", help=argparse.SUPPRESS)
    ap.add_argument("--xla-output", metavar="FILE", help=argparse.SUPPRESS)
    ap.add_argument("--num-partitions", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--shardy", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.generate:
        generate(args.generate)
        return 0
    if args.ours:
        measure_ours(args.ours, args.passes, args.num_partitions)
        return 0
    if args.xla_output:
        measure_xla_output(args.xla_output, args.num_partitions, args.shardy)
        return 0

    names = QUICK if args.quick else model_names([int(x) for x in args.layers.split(",")],
                                                 [int(x) for x in args.devices.split(",")])
    if args.only:
        names = [n for n in names if re.search(args.only, n)]
    if args.list:
        print("\n".join(names))
        return 0
    print(f"ours: {args.passes} (CPU s per pass, one child per file); XLA: its pass log of one compile "
          f"(s); x XLA = ours CPU / XLA; out KB / coll: the module after the pass (XLA's after "
          f"spmd-partitioning)\n")
    print_header()
    for name in names:
        print_result(run_file(name, args.passes, args.timeout), name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
