"""Random HLO modules for sharding-propagation agreement with XLA: few annotations, every op family.

random_hlo.py draws modules that XLA must run (its execution is the partitioner's oracle); this
generator draws modules that XLA must only propagate, so it reaches the op forms a running
program rarely shows: dots with several batch and contracting dims in any position,
convolutions with permuted dim labels and feature groups, gathers and scatters with any
index/offset/batching layout, variadic reduces and sorts, while loops, conditionals, calls,
tuples, unknown and pass-through custom-calls, `Sharding` custom-calls with open dims,
`shard_as`/`shard_like` groups, and partial replication.  One to three values are annotated
(a parameter, an intermediate value, a `Sharding` custom-call, the root); everything else is
left to propagation, and the entry's `allow_spmd_sharding_propagation_to_parameters/_output`
are true, false, absent or one flag per parameter / result.

    text = module_from_seed(17)                      # one module
    text = module_from_seed(17, families=("dot",))   # only dots (and the values they read)

Every family's name is the key of FAMILIES; benchmarks/fuzz_propagation.py groups its
figures by these names.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

# Few size-1 dims: the import turns a transpose that moves one into a reshape, an iota along one
# into a broadcast zero, and so on.
DIMS = (2, 3, 4, 4, 6, 8, 8, 12, 16, 16, 1)
UNARY = ("negate", "abs", "exponential", "tanh", "sqrt", "floor", "sine")
BINARY = ("add", "subtract", "multiply", "maximum", "minimum", "divide")


@dataclass
class Value:
    name: str
    dims: tuple[int, ...]
    etype: str = "f32"
    tuple_shape: str = ""  # a tuple-shaped value (a while body's parameter) spells its shape here

    @property
    def shape(self) -> str:
        return self.tuple_shape or f"{self.etype}[{','.join(map(str, self.dims))}]"


@dataclass
class Body:
    """The instructions of one computation under construction."""

    name: str
    lines: list[str] = field(default_factory=list)
    values: list[Value] = field(default_factory=list)


@dataclass
class Program:
    devices: int
    rng: random.Random
    params: list[tuple[Value, str | None]] = field(default_factory=list)
    computations: list[str] = field(default_factory=list)
    helpers: set[str] = field(default_factory=set)
    counter: int = 0
    annotations: int = 0
    max_annotations: int = 2
    groups: int = 0
    body: Body = field(default_factory=lambda: Body("main"))

    # ---------------------------------------------------------------- names --
    def fresh(self, hint: str) -> str:
        self.counter += 1
        return f"{hint}.{self.counter}"

    def emit(self, hint: str, dims, text: str, etype: str = "f32", sharding: str | None = None,
             keep: bool = True) -> Value:
        v = Value(self.fresh(hint), tuple(dims), etype)
        attr = f", sharding={sharding}" if sharding else ""
        self.body.lines.append(f"  {v.name} = {v.shape} {text}{attr}")
        if keep and etype == "f32":
            self.body.values.append(v)
        return v

    def constant(self, hint: str = "constant", etype: str = "f32") -> Value:
        """A scalar constant of a value no other constant has: the import merges equal constants
        into one, which would link their users."""
        return self.emit(hint, (), f"constant({self.counter + 2})", etype=etype, keep=False)

    def line(self, text: str) -> None:
        self.body.lines.append(f"  {text}")

    def parameter(self, dims, etype: str = "f32") -> Value:
        """A new entry parameter (annotated now and then)."""
        v = Value(f"p{len(self.params)}", tuple(dims), etype)
        s = None
        if etype == "f32" and self.annotations < self.max_annotations and self.rng.random() < (
                0.7 if not self.params else 0.2):
            s = self.sharding(v.dims)
            self.annotations += 1
        self.params.append((v, s))
        if etype == "f32":
            self.body.values.append(v)
        return v

    def pick(self, rank: int | None = None, min_rank: int = 0, max_rank: int = 9) -> Value:
        pool = [v for v in self.body.values if (rank is None or len(v.dims) == rank)
                and min_rank <= len(v.dims) <= max_rank]
        if not pool:
            dims = tuple(self.rng.choice(DIMS) for _ in range(rank if rank is not None else max(min_rank, 2)))
            return self.parameter(dims)
        # recent values more often: chains are where propagation has work to do
        return pool[-1 - min(int(self.rng.expovariate(0.6)), len(pool) - 1)]

    def like(self, dims: tuple[int, ...]) -> Value:
        """A value of exactly `dims` (an existing one, else a new parameter)."""
        same = [v for v in self.body.values if v.dims == tuple(dims)]
        return self.rng.choice(same) if same and self.rng.random() < 0.7 else self.parameter(dims)

    # ------------------------------------------------------------ shardings --
    def sharding(self, dims: tuple[int, ...], *, tiled_only: bool = False) -> str:
        """A random sharding of an array of `dims`: tiled on random dims, partially replicated,
        replicated or (rarely) maximal; device lists explicit or in iota form."""
        r, n = self.rng, self.devices
        roll = r.random()
        if not tiled_only and roll < 0.06:
            return "{replicated}"
        if not tiled_only and roll < 0.08:
            return f"{{maximal device={r.randrange(n)}}}"
        tiles = [1] * len(dims)
        left = n
        for d in r.sample(range(len(dims)), len(dims)):
            if left == 1 or r.random() < 0.35:
                continue
            f = r.choice([f for f in (2, 4, 8) if left % f == 0])
            if dims[d] % f and r.random() < 0.7:  # mostly even tiles
                continue
            tiles[d] = f
            left //= f
        if math.prod(tiles) == 1:
            if dims and max(dims) > 1:
                d = max(range(len(dims)), key=lambda i: dims[i])
                tiles[d] = 2 if n % 2 == 0 else 1
                left = n // tiles[d]
            if math.prod(tiles) == 1:
                return "{replicated}"
        full = tiles + ([left] if left > 1 else [])
        tail = " last_tile_dim_replicate" if left > 1 else ""
        roll = r.random()
        if roll < 0.35:
            devices = f"<={[n]}".replace(" ", "")
        elif roll < 0.5 and len(full) > 1:
            perm = list(range(len(full)))
            r.shuffle(perm)
            shape = [full[p] for p in perm]
            inverse = [perm.index(i) for i in range(len(full))]
            devices = f"<=[{','.join(map(str, shape))}]T({','.join(map(str, inverse))})"
        else:
            order = list(range(n))
            r.shuffle(order)
            devices = ",".join(map(str, order))
        return f"{{devices=[{','.join(map(str, full))}]{devices}{tail}}}"

    def maybe_annotation(self, dims) -> str | None:
        """A sharding for a new intermediate value, while the module has few."""
        if self.annotations < self.max_annotations and self.rng.random() < 0.2:
            self.annotations += 1
            return self.sharding(dims)
        return None

    # -------------------------------------------------------------- helpers --
    def helper(self, name: str, text: str) -> str:
        if name not in self.helpers:
            self.helpers.add(name)
            self.computations.append(text)
        return name

    def reducer(self, op: str = "add", etype: str = "f32") -> str:
        name = f"r_{op}_{etype}"
        return self.helper(name, f"{name} {{\n  a = {etype}[] parameter(0)\n  b = {etype}[] parameter(1)\n"
                                 f"  ROOT c = {etype}[] {op}(a, b)\n}}\n")

    def comparator(self, types: tuple[str, ...]) -> str:
        name = "cmp_" + "_".join(types)
        params = "\n".join(f"  a{i} = {t}[] parameter({2 * i})\n  b{i} = {t}[] parameter({2 * i + 1})"
                           for i, t in enumerate(types))
        return self.helper(name, f"{name} {{\n{params}\n  ROOT c = pred[] compare(a0, b0), direction=LT\n}}\n")

    def unused(self) -> list[Value]:
        body = "\n".join(self.body.lines)
        return [v for v in reversed(self.body.values)
                if not any(f"{c}{v.name}{e}" in body for c in "( " for e in ",)")]

    # -------------------------------------------------------------- the text --
    def module_text(self, header: str) -> str:
        r = self.rng
        # every value nothing reads (the import drops dead values, and a variadic reduce's or a
        # sort's unused results with them)
        results = self.unused()[:8] or [self.body.values[-1]]
        params = [f"  {v.name} = {v.shape} parameter({i})" + (f", sharding={s}" if s else "")
                  for i, (v, s) in enumerate(self.params)]
        root_sharding = None
        if self.annotations == 0 or r.random() < 0.15:
            root_sharding = (self.sharding(results[0].dims) if len(results) == 1 else
                             "{" + ", ".join(self.sharding(v.dims) for v in results) + "}")
        attr = f", sharding={root_sharding}" if root_sharding else ""
        lines = params + self.body.lines
        if len(results) == 1 and r.random() < 0.5:
            lines.append(f"  ROOT out = {results[0].shape} copy({results[0].name}){attr}")
        else:
            shape = "(" + ", ".join(v.shape for v in results) + ")"
            lines.append(f"  ROOT out = {shape} tuple({', '.join(v.name for v in results)}){attr}")
        return (header + "\n\n" + "\n".join(self.computations)
                + "\nENTRY main {\n" + "\n".join(lines) + "\n}\n"), len(results)


def _csv(xs) -> str:
    return ",".join(map(str, xs))


def _literal(dims, values) -> str:
    """The literal text of an array constant of `dims` holding `values` (row-major)."""
    if not dims:
        return str(values[0])
    step = len(values) // dims[0]
    return "{" + ", ".join(_literal(dims[1:], values[i * step:(i + 1) * step]) for i in range(dims[0])) + "}"


def iota(p: "Program", dims, dim: int, etype: str = "f32", sharding: str | None = None) -> Value:
    """An iota in the form XLA's import leaves it: of rank 1, broadcast to `dims` (the import
    rewrites a wider iota into that pair, and a length-1 one into a broadcast zero)."""
    dims = tuple(dims)
    if dims[dim] == 1:
        zero = p.constant("zero", etype=etype)
        return p.emit("broadcast", dims, f"broadcast({zero.name}), dimensions={{}}", etype=etype, sharding=sharding)
    if len(dims) == 1:
        return p.emit("iota", dims, "iota(), iota_dimension=0", etype=etype, sharding=sharding)
    line = p.emit("iota", (dims[dim],), "iota(), iota_dimension=0", etype=etype, keep=False)
    return p.emit("broadcast", dims, f"broadcast({line.name}), dimensions={{{dim}}}", etype=etype, sharding=sharding)


# --------------------------------------------------------------- families --
def op_elementwise(p: Program) -> None:
    r = p.rng
    x = p.pick()
    roll = r.random()
    if roll < 0.3:
        op = r.choice(UNARY)
        p.emit(op, x.dims, f"{op}({x.name})", sharding=p.maybe_annotation(x.dims))
    elif roll < 0.7:
        y = p.like(x.dims)
        op = r.choice(BINARY)
        p.emit(op, x.dims, f"{op}({x.name}, {y.name})", sharding=p.maybe_annotation(x.dims))
    elif roll < 0.85:
        y = p.like(x.dims)
        c = p.emit("cmp", x.dims, f"compare({x.name}, {y.name}), direction=GT", etype="pred")
        p.emit("select", x.dims, f"select({c.name}, {x.name}, {y.name})", sharding=p.maybe_annotation(x.dims))
    elif roll < 0.93:
        lo, hi = p.like(x.dims), p.like(x.dims)
        p.emit("clamp", x.dims, f"clamp({lo.name}, {x.name}, {hi.name})")
    else:
        c = p.emit("convert", x.dims, f"convert({x.name})", etype="bf16")
        p.emit("convert", x.dims, f"convert({c.name})", sharding=p.maybe_annotation(x.dims))


def op_broadcast(p: Program) -> None:
    r = p.rng
    x = p.pick(max_rank=3)
    extra = r.randint(1, 2) if len(x.dims) < 3 else 1
    out_rank = len(x.dims) + extra
    kept = sorted(r.sample(range(out_rank), len(x.dims)))
    dims, it = [], iter(x.dims)
    for i in range(out_rank):
        dims.append(next(it) if i in kept else r.choice(DIMS))
    if r.random() < 0.2:  # a scalar broadcast, as constants are
        c = p.constant("constant")
        p.emit("broadcast", dims, f"broadcast({c.name}), dimensions={{}}")
        return
    p.emit("broadcast", dims, f"broadcast({x.name}), dimensions={{{_csv(kept)}}}",
           sharding=p.maybe_annotation(dims))


def _factorizations(total: int, max_rank: int, rng: random.Random) -> tuple[int, ...]:
    dims = []
    left = total
    while left > 1 and len(dims) < max_rank - 1:
        f = rng.choice([f for f in range(2, left + 1) if left % f == 0])
        dims.append(f)
        left //= f
    if left > 1 or not dims:
        dims.append(left)
    rng.shuffle(dims)
    return tuple(dims)


def op_reshape(p: Program) -> None:
    r = p.rng
    x = p.pick(min_rank=1)
    total = math.prod(x.dims)
    roll = r.random()
    if roll < 0.3 and len(x.dims) >= 2:  # merge adjacent dims
        i = r.randrange(len(x.dims) - 1)
        dims = x.dims[:i] + (x.dims[i] * x.dims[i + 1],) + x.dims[i + 2:]
    elif roll < 0.6:  # split a dim
        i = r.randrange(len(x.dims))
        factors = [f for f in range(2, x.dims[i]) if x.dims[i] % f == 0]
        if not factors:
            return
        f = r.choice(factors)
        dims = x.dims[:i] + (f, x.dims[i] // f) + x.dims[i + 1:]
    elif roll < 0.75:  # insert or drop a size-1 dim
        if 1 in x.dims and r.random() < 0.5:
            i = x.dims.index(1)
            dims = x.dims[:i] + x.dims[i + 1:]
        else:
            i = r.randrange(len(x.dims) + 1)
            dims = x.dims[:i] + (1,) + x.dims[i:]
    else:  # any other factorization
        dims = _factorizations(total, 4, r)
    if len(dims) > 5 or math.prod(dims) != total or tuple(dims) == x.dims:  # the import drops a no-op
        return
    p.emit("reshape", dims, f"reshape({x.name})", sharding=p.maybe_annotation(dims))


def op_transpose(p: Program) -> None:
    x = p.pick(min_rank=2)
    perm = list(range(len(x.dims)))
    while perm == sorted(perm):  # the import drops an identity transpose
        p.rng.shuffle(perm)
    dims = tuple(x.dims[i] for i in perm)
    p.emit("transpose", dims, f"transpose({x.name}), dimensions={{{_csv(perm)}}}",
           sharding=p.maybe_annotation(dims))


def op_reverse(p: Program) -> None:
    x = p.pick(min_rank=1)
    rd = sorted(p.rng.sample(range(len(x.dims)), p.rng.randint(1, len(x.dims))))
    p.emit("reverse", x.dims, f"reverse({x.name}), dimensions={{{_csv(rd)}}}")


def op_reduce(p: Program) -> None:
    r = p.rng
    x = p.pick(min_rank=1)
    k = r.randint(1, len(x.dims))
    rdims = sorted(r.sample(range(len(x.dims)), k))
    dims = tuple(d for i, d in enumerate(x.dims) if i not in rdims)
    zero = p.constant("zero")
    if r.random() < 0.3:  # variadic: a value and its argmax-style partner
        y = p.like(x.dims)
        name = p.helper("r_pair", "r_pair {\n  a0 = f32[] parameter(0)\n  a1 = f32[] parameter(1)\n"
                                  "  b0 = f32[] parameter(2)\n  b1 = f32[] parameter(3)\n"
                                  "  sum0 = f32[] add(a0, b0)\n  max1 = f32[] maximum(a1, b1)\n"
                                  "  ROOT t = (f32[], f32[]) tuple(sum0, max1)\n}\n")
        shape = f"f32[{_csv(dims)}]"
        t = p.fresh("reduce")
        p.line(f"{t} = ({shape}, {shape}) reduce({x.name}, {y.name}, {zero.name}, {zero.name}), "
               f"dimensions={{{_csv(rdims)}}}, to_apply={name}")
        for i in range(2):
            p.emit("gte", dims, f"get-tuple-element({t}), index={i}")
        return
    p.emit("reduce", dims, f"reduce({x.name}, {zero.name}), dimensions={{{_csv(rdims)}}}, "
                           f"to_apply={p.reducer(r.choice(['add', 'maximum']))}", sharding=p.maybe_annotation(dims))


def op_dot(p: Program) -> None:
    """dot_general: batch and contracting dims anywhere in both operands."""
    r = p.rng
    x = p.pick(min_rank=1, max_rank=4)
    rank = len(x.dims)
    order = list(range(rank))
    r.shuffle(order)
    nb = r.randint(0, min(2, rank - 1)) if rank > 1 else 0
    nc = r.randint(1, min(2, rank - nb)) if rank - nb > 1 and r.random() < 0.3 else 1
    lb, lc = order[:nb], order[nb:nb + nc]
    lf = [d for d in range(rank) if d not in lb + lc]
    n_rf = r.choice([0, 1, 1, 1, 2])
    rf_sizes = [r.choice(DIMS) for _ in range(n_rf)]
    # rhs dims: its batch, contracting and free dims in a random order
    kinds = [("b", i) for i in range(nb)] + [("c", i) for i in range(nc)] + [("f", i) for i in range(n_rf)]
    r.shuffle(kinds)
    rhs_dims, rb, rc = [], [0] * nb, [0] * nc
    for pos, (kind, i) in enumerate(kinds):
        if kind == "b":
            rb[i] = pos
            rhs_dims.append(x.dims[lb[i]])
        elif kind == "c":
            rc[i] = pos
            rhs_dims.append(x.dims[lc[i]])
        else:
            rhs_dims.append(rf_sizes[i])
    y = p.like(tuple(rhs_dims))
    rf = [pos for pos, (kind, _) in enumerate(kinds) if kind == "f"]
    out = [x.dims[d] for d in lb] + [x.dims[d] for d in lf] + [rhs_dims[d] for d in rf]
    attrs = f"lhs_contracting_dims={{{_csv(lc)}}}, rhs_contracting_dims={{{_csv(rc)}}}"
    if nb:
        attrs = f"lhs_batch_dims={{{_csv(lb)}}}, rhs_batch_dims={{{_csv(rb)}}}, " + attrs
    p.emit("dot", out, f"dot({x.name}, {y.name}), {attrs}", sharding=p.maybe_annotation(out))


def op_convolution(p: Program) -> None:
    """1-D or 2-D convolutions with permuted dim labels, strides, padding, dilation and
    feature groups (a kernel of size 1 is a dot in disguise)."""
    r = p.rng
    spatial = r.choice([1, 1, 2])
    x = p.pick(rank=spatial + 2)
    labels_in = ["b", "f"] + [str(i) for i in range(spatial)]
    r.shuffle(labels_in)
    dim_of = {label: x.dims[i] for i, label in enumerate(labels_in)}
    feature = dim_of["f"]
    groups = r.choice([d for d in (1, 2, feature) if feature % d == 0]) if r.random() < 0.25 else 1
    out_f = r.choice([1, 2, 4, 8]) * groups
    windows, out_sp, window_text = [], [], []
    for i in range(spatial):
        size = dim_of[str(i)]
        k = r.randint(1, min(size, 3))
        stride = r.choice([1, 1, 2])
        lo, hi = (r.randint(0, k - 1), r.randint(0, k - 1)) if k > 1 else (0, 0)
        rhs_dil = r.choice([1, 1, 2]) if k > 1 else 1
        eff = (k - 1) * rhs_dil + 1
        o = (size + lo + hi - eff) // stride + 1
        if o < 1:
            return
        windows.append(k)
        out_sp.append(o)
        window_text.append((k, stride, f"{lo}_{hi}", rhs_dil))
    labels_k = ["i", "o"] + [str(i) for i in range(spatial)]
    r.shuffle(labels_k)
    kdim = {"i": feature // groups, "o": out_f, **{str(i): windows[i] for i in range(spatial)}}
    kernel = p.like(tuple(kdim[label] for label in labels_k))
    labels_out = ["b", "f"] + [str(i) for i in range(spatial)]
    r.shuffle(labels_out)
    odim = {"b": dim_of["b"], "f": out_f, **{str(i): out_sp[i] for i in range(spatial)}}
    out = tuple(odim[label] for label in labels_out)
    window = (f"size={'x'.join(str(w[0]) for w in window_text)} stride={'x'.join(str(w[1]) for w in window_text)} "
              f"pad={'x'.join(w[2] for w in window_text)}")
    if any(w[3] > 1 for w in window_text):
        window += f" rhs_dilate={'x'.join(str(w[3]) for w in window_text)}"
    extra = f", feature_group_count={groups}" if groups > 1 else ""
    p.emit("convolution", out, f"convolution({x.name}, {kernel.name}), window={{{window}}}, "
                               f"dim_labels={''.join(labels_in)}_{''.join(labels_k)}->{''.join(labels_out)}{extra}",
           sharding=p.maybe_annotation(out))


def op_slice_pad(p: Program) -> None:
    r = p.rng
    x = p.pick(min_rank=1)
    if r.random() < 0.5:
        spec, dims = [], []
        for d in x.dims:
            if r.random() < 0.5:
                spec.append(f"[0:{d}]")
                dims.append(d)
                continue
            lo = r.randrange(d)
            hi = r.randint(lo + 1, d)
            stride = r.choice([1, 1, 2]) if hi - lo > 2 else 1
            spec.append(f"[{lo}:{hi}" + (f":{stride}]" if stride > 1 else "]"))
            dims.append(-(-(hi - lo) // stride))
        if tuple(dims) == x.dims:  # the import drops a slice of everything
            return
        p.emit("slice", dims, f"slice({x.name}), slice={{{', '.join(spec)}}}", sharding=p.maybe_annotation(dims))
        return
    zero = p.constant("zero")
    cfg, dims = [], []
    for d in x.dims:
        if r.random() < 0.4:
            cfg.append("0_0")
            dims.append(d)
            continue
        lo, hi = r.randint(-min(1, d - 1), 2), r.randint(0, 2)
        interior = r.choice([0, 0, 1]) if d > 1 else 0
        cfg.append(f"{lo}_{hi}" + (f"_{interior}" if interior else ""))
        dims.append(lo + hi + d + (d - 1) * interior)
    if min(dims) < 1 or set(cfg) == {"0_0"}:
        return
    p.emit("pad", dims, f"pad({x.name}, {zero.name}), padding={'x'.join(cfg)}", sharding=p.maybe_annotation(dims))


def op_concatenate(p: Program) -> None:
    r = p.rng
    x = p.pick(min_rank=1)
    axis = r.randrange(len(x.dims))
    parts = [x]
    for _ in range(r.randint(1, 2)):
        dims = list(x.dims)
        dims[axis] = r.choice(DIMS)
        parts.append(p.like(tuple(dims)))
    r.shuffle(parts)
    dims = list(x.dims)
    dims[axis] = sum(v.dims[axis] for v in parts)
    p.emit("concatenate", dims, f"concatenate({', '.join(v.name for v in parts)}), dimensions={{{axis}}}",
           sharding=p.maybe_annotation(dims))


def _index_scalars(p: Program, bounds) -> list[str]:
    """Start indices: parameters, or values computed from one (all constants would make the
    import rewrite a dynamic-slice into a slice)."""
    names = []
    for b in bounds:
        i = p.parameter((), etype="s32")
        if p.rng.random() < 0.3:
            c = p.constant("c", etype="s32")
            i = p.emit("i", (), f"minimum({i.name}, {c.name})", etype="s32")
        names.append(i.name)
    return names


def op_dynamic_slice(p: Program) -> None:
    r = p.rng
    x = p.pick(min_rank=1)
    sizes = [d if r.random() < 0.5 else r.randint(1, d) for d in x.dims]
    idx = _index_scalars(p, [d - s for d, s in zip(x.dims, sizes)])
    if r.random() < 0.5:
        p.emit("dynamic-slice", sizes, f"dynamic-slice({x.name}, {', '.join(idx)}), "
                                       f"dynamic_slice_sizes={{{_csv(sizes)}}}", sharding=p.maybe_annotation(sizes))
        return
    update = p.like(tuple(sizes))
    p.emit("dynamic-update-slice", x.dims, f"dynamic-update-slice({x.name}, {update.name}, {', '.join(idx)})",
           sharding=p.maybe_annotation(x.dims))


def _indices(p: Program, batch: list[int], k: int, vector_dim: int, bounds: list[int]) -> Value:
    """s32 indices of batch dims `batch` with the index vector (length k) at `vector_dim`
    (== len(batch) and k == 1: the implicit trailing vector dim): a constant, an iota, or a
    parameter."""
    r = p.rng
    dims = list(batch)
    if vector_dim < len(batch) or k != 1 or r.random() < 0.5:
        dims.insert(vector_dim, k)
    roll = r.random()
    if roll < 0.25:
        return p.parameter(tuple(dims), etype="s32")
    if roll < 0.45 and dims:
        return iota(p, dims, r.randrange(len(dims)), etype="s32")
    values = [r.randint(0, max(bounds[(i % k)], 0)) for i in range(math.prod(dims))]
    return p.emit("idx", dims, f"constant({_literal(dims, values)})", etype="s32")


def op_gather(p: Program) -> None:
    """A gather of any layout: start_index_map, collapsed dims, explicit batching dims, the
    index vector anywhere, offset dims anywhere in the result."""
    r = p.rng
    x = p.pick(min_rank=1, max_rank=3)
    rank = len(x.dims)
    dims = list(range(rank))
    batching = []
    nbatch_idx = r.randint(1, 2)
    batch_sizes = [r.choice((1, 2, 4, 6, 8)) for _ in range(nbatch_idx)]
    if rank >= 2 and r.random() < 0.25:  # explicit batching dims (operand dim b <-> an index batch dim)
        b = r.randrange(rank)
        batching = [b]
        batch_sizes[0] = x.dims[b]
    free = [d for d in dims if d not in batching]
    k = r.randint(1, min(2, len(free)))
    start_map = r.sample(free, k)
    collapsed = sorted(d for d in start_map if r.random() < 0.6)
    slice_sizes = []
    for d in dims:
        if d in collapsed or d in batching:
            slice_sizes.append(1)
        elif d in start_map:
            slice_sizes.append(r.randint(1, x.dims[d]))
        else:
            slice_sizes.append(x.dims[d] if r.random() < 0.8 else r.randint(1, x.dims[d]))
    vector_dim = r.randint(0, nbatch_idx)
    bounds = [x.dims[d] - slice_sizes[d] for d in start_map]
    idx = _indices(p, batch_sizes, k, vector_dim, bounds)
    idx_batch_dims = [i for i in range(len(idx.dims)) if not (i == vector_dim and len(idx.dims) > nbatch_idx)]
    offset_sizes = [slice_sizes[d] for d in dims if d not in collapsed and d not in batching]
    out_rank = nbatch_idx + len(offset_sizes)
    offset_dims = sorted(r.sample(range(out_rank), len(offset_sizes)))
    out, bi, oi = [], iter(batch_sizes), iter(offset_sizes)
    for i in range(out_rank):
        out.append(next(oi) if i in offset_dims else next(bi))
    attrs = (f"offset_dims={{{_csv(offset_dims)}}}, collapsed_slice_dims={{{_csv(collapsed)}}}, "
             f"start_index_map={{{_csv(start_map)}}}, index_vector_dim={vector_dim}")
    if batching:
        attrs += f", operand_batching_dims={{{_csv(batching)}}}, start_indices_batching_dims={{{idx_batch_dims[0]}}}"
    p.emit("gather", out, f"gather({x.name}, {idx.name}), {attrs}, slice_sizes={{{_csv(slice_sizes)}}}",
           sharding=p.maybe_annotation(out))


def op_scatter(p: Program) -> None:
    r = p.rng
    x = p.pick(min_rank=1, max_rank=3)
    rank = len(x.dims)
    dims = list(range(rank))
    batching = []
    nbatch_idx = r.randint(1, 2)
    batch_sizes = [r.choice((1, 2, 4, 6)) for _ in range(nbatch_idx)]
    if rank >= 2 and r.random() < 0.25:
        b = r.randrange(rank)
        batching = [b]
        batch_sizes[0] = x.dims[b]
    free = [d for d in dims if d not in batching]
    k = r.randint(1, min(2, len(free)))
    to_operand = r.sample(free, k)
    inserted = sorted(d for d in to_operand if r.random() < 0.6)
    window = []
    for d in dims:
        if d in inserted or d in batching:
            continue
        window.append(x.dims[d] if r.random() < 0.7 else r.randint(1, x.dims[d]))
    vector_dim = r.randint(0, nbatch_idx)
    bounds = [x.dims[d] for d in to_operand]
    idx = _indices(p, batch_sizes, k, vector_dim, bounds)
    idx_batch_dims = [i for i in range(len(idx.dims)) if not (i == vector_dim and len(idx.dims) > nbatch_idx)]
    upd_rank = nbatch_idx + len(window)
    window_dims = sorted(r.sample(range(upd_rank), len(window)))
    upd, bi, wi = [], iter(batch_sizes), iter(window)
    for i in range(upd_rank):
        upd.append(next(wi) if i in window_dims else next(bi))
    updates = p.like(tuple(upd))
    attrs = (f"update_window_dims={{{_csv(window_dims)}}}, inserted_window_dims={{{_csv(inserted)}}}, "
             f"scatter_dims_to_operand_dims={{{_csv(to_operand)}}}, index_vector_dim={vector_dim}")
    if batching:
        attrs += f", input_batching_dims={{{_csv(batching)}}}, scatter_indices_batching_dims={{{idx_batch_dims[0]}}}"
    p.emit("scatter", x.dims, f"scatter({x.name}, {idx.name}, {updates.name}), {attrs}, to_apply={p.reducer()}",
           sharding=p.maybe_annotation(x.dims))


def op_sort(p: Program) -> None:
    r = p.rng
    x = p.pick(min_rank=1)
    d = r.randrange(len(x.dims))
    if r.random() < 0.5:
        p.emit("sort", x.dims, f"sort({x.name}), dimensions={{{d}}}, to_apply={p.comparator(('f32',))}",
               sharding=p.maybe_annotation(x.dims))
        return
    io = iota(p, x.dims, d, etype="s32")
    t = p.fresh("sort")
    shapes = f"({x.shape}, s32[{_csv(x.dims)}])"
    p.line(f"{t} = {shapes} sort({x.name}, {io.name}), dimensions={{{d}}}, is_stable=true, "
           f"to_apply={p.comparator(('f32', 's32'))}")
    p.emit("gte", x.dims, f"get-tuple-element({t}), index=0")
    g = p.emit("gte", x.dims, f"get-tuple-element({t}), index=1", etype="s32")
    p.emit("convert", x.dims, f"convert({g.name})")  # a result nothing reads is dropped by the import


def op_reduce_window(p: Program) -> None:
    r = p.rng
    x = p.pick(min_rank=1)
    init = p.constant("init")
    sizes, strides, pads, dims, base = [], [], [], [], []
    for d in x.dims:
        k = r.randint(1, min(d, 3))
        s = r.randint(1, 2)
        lo, hi = (r.randint(0, k - 1), r.randint(0, k - 1)) if k > 1 else (0, 0)
        bd = 2 if r.random() < 0.1 and d > 1 else 1
        ed = (d - 1) * bd + 1
        sizes.append(k), strides.append(s), pads.append(f"{lo}_{hi}"), base.append(bd)
        dims.append((ed + lo + hi - k) // s + 1)
    window = f"size={'x'.join(map(str, sizes))} stride={'x'.join(map(str, strides))} pad={'x'.join(pads)}"
    if any(b > 1 for b in base):
        window += f" lhs_dilate={'x'.join(map(str, base))}"
    p.emit("reduce-window", dims, f"reduce-window({x.name}, {init.name}), window={{{window}}}, "
                                  f"to_apply={p.reducer(r.choice(['add', 'maximum']))}",
           sharding=p.maybe_annotation(dims))


def op_select_and_scatter(p: Program) -> None:
    r = p.rng
    x = p.pick(min_rank=1)
    sizes, strides, dims = [], [], []
    for d in x.dims:
        k = r.randint(1, min(d, 2))
        s = k if r.random() < 0.7 else 1
        sizes.append(k), strides.append(s)
        dims.append((d - k) // s + 1)
    source = p.like(tuple(dims))
    init = p.constant("init")
    ge = p.helper("sel_ge", "sel_ge {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n"
                            "  ROOT c = pred[] compare(a, b), direction=GE\n}\n")
    window = f"size={'x'.join(map(str, sizes))} stride={'x'.join(map(str, strides))}"
    p.emit("select-and-scatter", x.dims, f"select-and-scatter({x.name}, {source.name}, {init.name}), "
                                         f"window={{{window}}}, select={ge}, scatter={p.reducer()}")


def op_iota_constant(p: Program) -> None:
    r = p.rng
    x = p.pick(min_rank=1)
    roll = r.random()
    if roll < 0.5:
        io = iota(p, x.dims, r.randrange(len(x.dims)), sharding=p.maybe_annotation(x.dims))
    elif roll < 0.8:
        c = p.constant("constant")
        io = p.emit("broadcast", x.dims, f"broadcast({c.name}), dimensions={{}}")
    else:
        t = p.fresh("rng")
        p.line(f"{t} = (u64[2], u32[{_csv(x.dims)}]) rng-bit-generator(seed.{t}), algorithm=rng_default"
               .replace(f"seed.{t}", p.emit("seed", (2,), "constant({1, 2})", etype="u64").name))
        g = p.emit("bits", x.dims, f"get-tuple-element({t}), index=1", etype="u32")
        io = p.emit("convert", x.dims, f"convert({g.name})")
    op = r.choice(BINARY)
    p.emit(op, x.dims, f"{op}({x.name}, {io.name})")


def _body_ops(p: Program, v: Value, count: int) -> Value:
    """A few shape-preserving ops on `v` (inside a called computation)."""
    r = p.rng
    for _ in range(count):
        roll = r.random()
        if roll < 0.5:
            op = r.choice(UNARY)
            v = p.emit(op, v.dims, f"{op}({v.name})", keep=False, sharding=p.maybe_annotation(v.dims))
        elif roll < 0.8:
            op = r.choice(BINARY)
            c = p.constant("constant")
            b = p.emit("broadcast", v.dims, f"broadcast({c.name}), dimensions={{}}", keep=False)
            v = p.emit(op, v.dims, f"{op}({v.name}, {b.name})", keep=False)
        elif len(v.dims) >= 2 and v.dims[0] == v.dims[1]:
            perm = [1, 0] + list(range(2, len(v.dims)))
            v = p.emit("transpose", v.dims, f"transpose({v.name}), dimensions={{{_csv(perm)}}}", keep=False)
        elif v.dims and r.random() < 0.5:
            d = r.randrange(len(v.dims))
            zero = p.constant("zero")
            red = p.emit("reduce", v.dims[:d] + v.dims[d + 1:], f"reduce({v.name}, {zero.name}), dimensions={{{d}}}, "
                                                                f"to_apply={p.reducer()}", keep=False)
            v = p.emit("broadcast", v.dims, f"broadcast({red.name}), dimensions="
                                            f"{{{_csv([i for i in range(len(v.dims)) if i != d])}}}", keep=False)
        else:
            op = r.choice(UNARY)
            v = p.emit(op, v.dims, f"{op}({v.name})", keep=False)
    return v


def _in_computation(p: Program, name: str, params: list[Value], build) -> tuple[str, str]:
    """Run `build(params)` with the program writing into a new computation; returns its text
    header/body and the root's shape."""
    outer = p.body
    p.body = Body(name)
    for i, v in enumerate(params):
        p.line(f"{v.name} = {v.shape} parameter({i})")
    root_shape = build(params)
    text = f"{name} {{\n" + "\n".join(p.body.lines) + "\n}\n"
    p.body = outer
    return text, root_shape


def op_while(p: Program) -> None:
    """A while loop over (counter, values...): the body works on each value, the condition on
    the counter."""
    r = p.rng
    carried = [p.pick() for _ in range(r.randint(1, 2))]
    shapes = ["s32[]"] + [v.shape for v in carried]
    tshape = "(" + ", ".join(shapes) + ")"
    body_name, cond_name = p.fresh("body"), p.fresh("cond")

    def body(params):
        t = params[0]
        i = p.emit("i", (), f"get-tuple-element({t.name}), index=0", etype="s32", keep=False)
        one = p.constant("one", etype="s32")
        outs = [p.emit("next", (), f"add({i.name}, {one.name})", etype="s32", keep=False).name]
        for k, v in enumerate(carried):
            e = p.emit("e", v.dims, f"get-tuple-element({t.name}), index={k + 1}", keep=False)
            outs.append(_body_ops(p, e, r.randint(1, 3)).name)
        p.line(f"ROOT t = {tshape} tuple({', '.join(outs)})")
        return tshape

    def cond(params):
        t = params[0]
        i = p.emit("i", (), f"get-tuple-element({t.name}), index=0", etype="s32", keep=False)
        n = p.constant("n", etype="s32")
        p.line(f"ROOT lt = pred[] compare({i.name}, {n.name}), direction=LT")
        return "pred[]"

    body_text, _ = _in_computation(p, body_name, [Value("arg", (), tuple_shape=tshape)], body)
    cond_text, _ = _in_computation(p, cond_name, [Value("arg", (), tuple_shape=tshape)], cond)
    p.computations += [body_text, cond_text]
    zero = p.constant("zero", etype="s32")
    init = p.fresh("init")
    p.line(f"{init} = {tshape} tuple({', '.join([zero.name] + [v.name for v in carried])})")
    w = p.fresh("while")
    sharding = None
    if p.annotations < p.max_annotations and r.random() < 0.1:
        p.annotations += 1
        sharding = "{{replicated}, " + ", ".join(p.sharding(v.dims) for v in carried) + "}"
    p.line(f"{w} = {tshape} while({init}), condition={cond_name}, body={body_name}"
           + (f", sharding={sharding}" if sharding else ""))
    for k, v in enumerate(carried):
        p.emit("result", v.dims, f"get-tuple-element({w}), index={k + 1}")


def op_conditional(p: Program) -> None:
    r = p.rng
    x = p.pick()
    y = p.like(x.dims) if r.random() < 0.5 else x
    names = [p.fresh("branch") for _ in range(2)]
    as_tuple = r.random() < 0.4

    def branch(params):
        v = _body_ops(p, params[0], r.randint(1, 2))
        if as_tuple:
            p.line(f"ROOT t = ({v.shape}) tuple({v.name})")
            return f"({v.shape})"
        p.line(f"ROOT r = {v.shape} copy({v.name})")
        return v.shape

    for name, operand in zip(names, (x, y)):
        text, shape = _in_computation(p, name, [Value(p.fresh("bp"), operand.dims)], branch)
        p.computations.append(text)
    pred = p.parameter((), etype="pred") if r.random() < 0.5 else p.emit(
        "pred", (), "constant(true)", etype="pred")
    c = p.fresh("conditional")
    p.line(f"{c} = {shape} conditional({pred.name}, {x.name}, {y.name}), "
           f"true_computation={names[0]}, false_computation={names[1]}")
    if as_tuple:
        p.emit("result", x.dims, f"get-tuple-element({c}), index=0")
    else:
        p.body.values.append(Value(c, x.dims))


def op_call(p: Program) -> None:
    r = p.rng
    x = p.pick()
    name = p.fresh("callee")
    returns_tuple = r.random() < 0.4

    def callee(params):
        v = _body_ops(p, params[0], r.randint(1, 3))
        if returns_tuple:
            p.line(f"ROOT t = ({v.shape}, {params[0].shape}) tuple({v.name}, {params[0].name})")
            return f"({v.shape}, {params[0].shape})"
        p.line(f"ROOT r = {v.shape} negate({v.name})")
        return v.shape

    text, shape = _in_computation(p, name, [Value(p.fresh("cp"), x.dims)], callee)
    p.computations.append(text)
    c = p.fresh("call")
    p.line(f"{c} = {shape} call({x.name}), to_apply={name}")
    if returns_tuple:
        for i in range(2):
            p.emit("result", x.dims, f"get-tuple-element({c}), index={i}")
    else:
        p.body.values.append(Value(c, x.dims))


def op_tuple(p: Program) -> None:
    r = p.rng
    parts = [p.pick() for _ in range(r.randint(1, 3))]
    t = p.fresh("tuple")
    shape = "(" + ", ".join(v.shape for v in parts) + ")"
    p.line(f"{t} = {shape} tuple({', '.join(v.name for v in parts)})")
    if r.random() < 0.5:
        t2 = p.fresh("barrier")
        p.line(f"{t2} = {shape} opt-barrier({t})")
        t = t2
    k = r.randrange(len(parts))
    p.emit("gte", parts[k].dims, f"get-tuple-element({t}), index={k}")


def op_custom_call(p: Program) -> None:
    """`Sharding` annotations (with open dims now and then), unknown targets, and the
    pass-through targets XLA knows."""
    r = p.rng
    x = p.pick()
    roll = r.random()
    if roll < 0.5 and x.dims:
        s = p.sharding(x.dims, tiled_only=True)
        config = ""
        if r.random() < 0.4:
            open_dims = sorted(r.sample(range(len(x.dims)), r.randint(1, len(x.dims))))
            config = f', backend_config="unspecified_dims=[{_csv(open_dims)}]"'
        p.annotations += 1
        p.emit("constraint", x.dims, f'custom-call({x.name}), custom_call_target="Sharding"{config}', sharding=s)
    elif roll < 0.7:
        out = x.dims if r.random() < 0.6 else tuple(r.choice(DIMS) for _ in range(len(x.dims)))
        p.emit("custom", out, f'custom-call({x.name}), custom_call_target="my_op"')
    elif roll < 0.85:
        target = r.choice(["ResizeNearest", "Cholesky", "ResizeBilinearGrad"])
        p.emit("passthrough", x.dims, f'custom-call({x.name}), custom_call_target="{target}"')
    else:  # a barrier keeps a sharding from crossing one way
        target = r.choice(["ShardBarrierFrom", "ShardBarrierTo"])
        p.emit("barrier", x.dims, f'custom-call({x.name}), custom_call_target="{target}"')


def op_collective(p: Program) -> None:
    """Collectives over every device: all-reduce with and without a channel, all-gather."""
    r = p.rng
    x = p.pick(min_rank=1)
    everyone = "{{" + ",".join(map(str, range(p.devices))) + "}}"
    roll = r.random()
    if roll < 0.4:
        p.emit("all-reduce", x.dims, f"all-reduce({x.name}), replica_groups={{}}, to_apply={p.reducer()}")
    elif roll < 0.75:
        p.counter += 1
        p.emit("all-reduce", x.dims, f"all-reduce({x.name}), channel_id={p.counter}, replica_groups={everyone}, "
                                     f"use_global_device_ids=true, to_apply={p.reducer()}")
    else:
        d = r.randrange(len(x.dims))
        dims = list(x.dims)
        dims[d] *= p.devices
        p.counter += 1
        p.emit("all-gather", dims, f"all-gather({x.name}), channel_id={p.counter}, replica_groups={everyone}, "
                                   f"use_global_device_ids=true, dimensions={{{d}}}")


def op_shard_group(p: Program) -> None:
    """Two values of one shape in a `shard_as` or `shard_like` group: as JAX's shard_alike
    writes it (`{unknown shard_as N}` custom-calls), or as shardings that name a group."""
    r = p.rng
    x = p.pick(min_rank=1)
    y = p.like(x.dims)
    kind = r.choice(["shard_as", "shard_like"])
    g = p.groups
    p.groups += 1
    if r.random() < 0.5:
        a = p.emit("alike", x.dims, f'custom-call({x.name}), custom_call_target="Sharding"',
                   sharding=f"{{unknown {kind} {g}}}")
        b = p.emit("alike", x.dims, f'custom-call({y.name}), custom_call_target="Sharding"',
                   sharding=f"{{unknown {kind} {g}}}")
    else:
        a = p.emit("negate", x.dims, f"negate({x.name})",
                   sharding=p.sharding(x.dims, tiled_only=True)[:-1] + f" {kind} {g}}}")
        b = p.emit("negate", x.dims, f"negate({y.name})", sharding=f"{{unknown {kind} {g}}}")
        p.annotations += 1
    p.emit("add", x.dims, f"add({a.name}, {b.name})")


FAMILIES = {
    "elementwise": op_elementwise, "broadcast": op_broadcast, "reshape": op_reshape, "transpose": op_transpose,
    "reverse": op_reverse, "reduce": op_reduce, "dot": op_dot, "convolution": op_convolution,
    "slice-pad": op_slice_pad, "concatenate": op_concatenate, "dynamic-slice": op_dynamic_slice,
    "gather": op_gather, "scatter": op_scatter, "sort": op_sort, "reduce-window": op_reduce_window,
    "select-and-scatter": op_select_and_scatter, "iota-constant": op_iota_constant, "while": op_while,
    "conditional": op_conditional, "call": op_call, "tuple": op_tuple, "custom-call": op_custom_call,
    "shard-group": op_shard_group, "collective": op_collective,
}


def _flag(rng: random.Random, count: int) -> str | None:
    roll = rng.random()
    if roll < 0.35:
        return None
    if roll < 0.65:
        return "{true}"
    if roll < 0.85:
        return "{false}"
    return "{" + ",".join(rng.choice(["true", "false"]) for _ in range(count)) + "}"


def build(rng: random.Random, *, families: tuple[str, ...] | None = None, length: int | None = None) -> str:
    p = Program(devices=rng.choice((2, 4, 4, 8, 8, 8)), rng=rng)
    p.max_annotations = rng.choice((1, 2, 2, 3, 4))
    for _ in range(rng.randint(1, 2)):
        p.parameter(tuple(rng.choice(DIMS) for _ in range(rng.randint(1, 3))))
    names = list(families or FAMILIES)
    for _ in range(length or rng.randint(3, 9)):
        FAMILIES[rng.choice(names)](p)
    # the header names the flags after the body, when the parameter and result counts are known
    text, results = p.module_text("HEADER")
    header = f"HloModule fuzz, num_partitions={p.devices}"
    to_params = _flag(rng, len(p.params))
    to_output = _flag(rng, results if "ROOT out = (" in text else 1)
    if to_params is not None:
        header += f", allow_spmd_sharding_propagation_to_parameters={to_params}"
    if to_output is not None:
        header += f", allow_spmd_sharding_propagation_to_output={to_output}"
    return text.replace("HEADER", header, 1)


def module_from_seed(seed: int, **kwargs) -> str:
    return build(random.Random(seed), **kwargs)
