"""Random modules of collectives through every combiner and reduce-scatter-creator.

Hypothesis builds modules of all-reduces, all-gathers, reduce-scatters and all-reduce +
dynamic-slice patterns over random replica groups (replica or global-id form, `{}` too),
element types, shapes, data dependencies between collectives, control edges and a while loop,
in modules that are scheduled or not, then runs a pass with random options.  Each run must not crash, must print something that
parses back and passes the structural verifier, must never add collectives, must leave while
bodies alone under `combine-while-loops=false`, and must compute, on all 8 devices, what the
input computes (XLA runs both)."""

from dataclasses import dataclass, field

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from hlo_passes.ir import Opcode
from hlo_passes.parse.module_parser import parse_module
from hlo_passes.passes.registry import lookup
from hlo_passes.printer import print_module
from hlo_passes.runtime import verify_equivalent
from hlo_passes.verifier import verify_module

DEVICES = 8
GROUP_SETS = [
    (),
    ((0, 1, 2, 3, 4, 5, 6, 7),),
    ((0, 1, 2, 3), (4, 5, 6, 7)),
    ((0, 2, 4, 6), (1, 3, 5, 7)),
    ((0, 1), (2, 3), (4, 5), (6, 7)),
    ((0, 4), (1, 5), (2, 6), (3, 7)),
]
TYPES = {"f32": "add_f32", "s32": "add_s32"}
REDUCTIONS = """add_f32 { a = f32[] parameter(0)
 b = f32[] parameter(1)
 ROOT s = f32[] add(a, b) }
max_f32 { a = f32[] parameter(0)
 b = f32[] parameter(1)
 ROOT s = f32[] maximum(a, b) }
add_s32 { a = s32[] parameter(0)
 b = s32[] parameter(1)
 ROOT s = s32[] add(a, b) }
"""


def groups_text(groups) -> str:
    return "{" + ",".join("{" + ",".join(map(str, g)) + "}" for g in groups) + "}"


@dataclass
class Builder:
    """Writes the ENTRY body: parameters, collectives and what links them."""

    global_ids: bool
    lines: list[str] = field(default_factory=list)
    params: list[str] = field(default_factory=list)
    results: list[tuple[str, str]] = field(default_factory=list)  # (name, shape) for the ROOT tuple
    collectives: list[str] = field(default_factory=list)
    n: int = 0
    channel: int = 0

    def name(self, hint: str) -> str:
        self.n += 1
        return f"{hint}{self.n}"

    def param(self, shape: str) -> str:
        name = self.name("p")
        self.lines.append(f"  {name} = {shape} parameter({len(self.params)})")
        self.params.append(name)
        return name

    def mode(self, groups) -> str:
        if not self.global_ids:
            return f"replica_groups={groups_text(groups)}"
        self.channel += 1
        return f"channel_id={self.channel}, replica_groups={groups_text(groups)}, use_global_device_ids=true"

    def operand(self, shape: str, dtype: str, dims, depend: int | None) -> str:
        """A fresh parameter, or one that also depends on an earlier collective's result."""
        p = self.param(shape)
        if depend is None or not self.results:
            return p
        src, src_shape = self.results[depend % len(self.results)]
        src_type = src_shape.split("[")[0]
        rank = src_shape.count(",") + 1 if src_shape.split("[")[1] != "]" else 0
        zero = self.name("z")
        self.lines.append(f"  {zero} = {src_type}[] constant(0)")
        total = self.name("sum")
        self.lines.append(f"  {total} = {src_type}[] reduce({src}, {zero}), dimensions={{{','.join(map(str, range(rank)))}}}, "
                          f"to_apply=add_{src_type}")
        if src_type != dtype:
            conv = self.name("cv")
            self.lines.append(f"  {conv} = {dtype}[] convert({total})")
            total = conv
        b = self.name("bc")
        self.lines.append(f"  {b} = {shape} broadcast({total}), dimensions={{}}")
        s = self.name("x")
        self.lines.append(f"  {s} = {shape} add({p}, {b})")
        return s

    def emit(self, text: str, control: list[int]) -> str:
        preds = [self.collectives[c % len(self.collectives)] for c in control] if self.collectives else []
        if preds:
            text += ", control-predecessors={" + ",".join(sorted(set(preds))) + "}"
        self.lines.append(text)
        return text


def shape(dtype: str, dims) -> str:
    return f"{dtype}[{','.join(map(str, dims))}]"


@st.composite
def collective_modules(draw):
    global_ids = draw(st.booleans())
    b = Builder(global_ids)
    usable = GROUP_SETS[1:] if global_ids else GROUP_SETS
    common_groups = draw(st.sampled_from(usable))  # most collectives share one group set and type,
    common_type = draw(st.sampled_from(sorted(TYPES)))  # so that keys meet often enough to merge
    for _ in range(draw(st.integers(2, 6))):
        kind = draw(st.sampled_from(["all-reduce", "all-gather", "reduce-scatter", "creator"]))
        groups = common_groups if draw(st.integers(0, 3)) else draw(st.sampled_from(usable))
        n = len(groups[0]) if groups else DEVICES
        dtype = common_type if draw(st.integers(0, 3)) else draw(st.sampled_from(sorted(TYPES)))
        rank = draw(st.integers(1, 3))
        dims = [draw(st.integers(1, 3)) for _ in range(rank)]
        dim = draw(st.integers(0, rank - 1))
        depend = draw(st.one_of(st.none(), st.integers(0, 10)))
        control = draw(st.lists(st.integers(0, 10), max_size=2))
        out = b.name(kind.replace("-", "_")[:2])
        if kind == "all-reduce":
            reduction = draw(st.sampled_from(["add", "max"])) if dtype == "f32" else "add"
            x = b.operand(shape(dtype, dims), dtype, dims, depend)
            b.emit(f"  {out} = {shape(dtype, dims)} all-reduce({x}), {b.mode(groups)}, "
                   f"to_apply={reduction}_{dtype}", control)
            result = shape(dtype, dims)
        elif kind == "all-gather":
            x = b.operand(shape(dtype, dims), dtype, dims, depend)
            full = list(dims)
            full[dim] *= n
            result = shape(dtype, full)
            b.emit(f"  {out} = {result} all-gather({x}), {b.mode(groups)}, dimensions={{{dim}}}", control)
        elif kind == "reduce-scatter":
            full = list(dims)
            full[dim] *= n
            x = b.operand(shape(dtype, full), dtype, full, depend)
            result = shape(dtype, dims)
            b.emit(f"  {out} = {result} reduce-scatter({x}), {b.mode(groups)}, dimensions={{{dim}}}, "
                   f"to_apply=add_{dtype}", control)
        else:
            out, (result_name, result) = creator_pattern(draw, b, groups, n, dtype, dims, dim, depend, control)
            b.collectives.append(out)
            b.results.append((result_name, result))
            continue
        b.collectives.append(out)
        b.results.append((out, result))
    return b, draw(st.booleans()), draw(st.booleans())


def creator_pattern(draw, b: Builder, groups, n: int, dtype: str, dims, dim: int, depend, control):
    """all-reduce + dynamic-slice at a table offset indexed by the device's id: the right
    table, or one with a wrong or out-of-range entry; sometimes through a reshape and with a
    few rows left over (a non-uniform split)."""
    shard = dims[dim]
    full = list(dims)
    full[dim] = shard * n + draw(st.integers(0, max(shard - 1, 0)))
    x = b.operand(shape(dtype, full), dtype, full, depend)
    ar = b.name("ar")
    b.emit(f"  {ar} = {shape(dtype, full)} all-reduce({x}), {b.mode(groups)}, to_apply=add_{dtype}", control)
    position = [0] * DEVICES
    for g in groups or [tuple(range(DEVICES))]:
        for k, d in enumerate(g):
            position[d] = k
    table = [position[d] * shard for d in range(DEVICES)]
    flaw = draw(st.sampled_from(["none", "none", "swap", "last+", "clamp"]))
    if flaw == "swap":
        table[0], table[-1] = table[-1], table[0]
    elif flaw == "last+":
        table[-1] += shard
    ident = b.name("id")
    b.lines.append(f"  {ident} = u32[] {'partition-id' if b.global_ids else 'replica-id'}()")
    t = b.name("table")
    b.lines.append(f"  {t} = s32[{DEVICES}] constant({{{','.join(map(str, table))}}})")
    one = b.name("one")
    b.lines.append(f"  {one} = s32[1] dynamic-slice({t}, {ident}), dynamic_slice_sizes={{1}}")
    off = b.name("off")
    b.lines.append(f"  {off} = s32[] reshape({one})")
    if flaw == "clamp":
        lo, hi, c = b.name("lo"), b.name("hi"), b.name("cl")
        b.lines.append(f"  {lo} = s32[] constant(0)\n  {hi} = s32[] constant({max(table) - 1})")
        b.lines.append(f"  {c} = s32[] clamp({lo}, {off}, {hi})")
        off = c
    zero = b.name("zero")
    b.lines.append(f"  {zero} = s32[] constant(0)")
    source, source_dims, sliced = ar, full, dim
    if draw(st.booleans()) and len(full) >= 2 and dim == 0:  # a reshape that keeps dim 0
        source_dims = [full[0], int(np.prod(full[1:]))]
        r = b.name("rs")
        b.lines.append(f"  {r} = {shape(dtype, source_dims)} reshape({ar})")
        source = r
    offsets = ", ".join(off if k == sliced else zero for k in range(len(source_dims)))
    sizes = list(source_dims)
    sizes[sliced] = shard
    ds = b.name("ds")
    b.lines.append(f"  {ds} = {shape(dtype, sizes)} dynamic-slice({source}, {offsets}), "
                   f"dynamic_slice_sizes={{{','.join(map(str, sizes))}}}")
    return ar, (ds, shape(dtype, sizes))


WHILE = """
body {
  s = (s32[], f32[8], f32[8]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  x = f32[8] get-tuple-element(s), index=1
  y = f32[8] get-tuple-element(s), index=2
  sx = f32[2] slice(x), slice={[0:2]}
  gx = f32[8] all-gather(sx), replica_groups=GROUPS, dimensions={0}
  ry = f32[2] reduce-scatter(y), replica_groups=GROUPS, dimensions={0}, to_apply=add_f32
  zf = f32[] constant(0)
  gy = f32[8] pad(ry, zf), padding=0_6
  ax = f32[8] all-reduce(gx), replica_groups=GROUPS, to_apply=add_f32
  sy = f32[2] slice(y), slice={[4:6]}
  hy = f32[8] all-gather(sy), replica_groups=GROUPS, dimensions={0}
  rx = f32[2] reduce-scatter(x), replica_groups=GROUPS, dimensions={0}, to_apply=add_f32
  gz = f32[8] pad(rx, zf), padding=6_0
  sum0 = f32[8] add(gy, hy)
  sum = f32[8] add(sum0, gz)
  ay = f32[8] all-reduce(sum), replica_groups=GROUPS, to_apply=add_f32
  one = s32[] constant(1)
  j = s32[] add(i, one)
  ROOT t = (s32[], f32[8], f32[8]) tuple(j, ax, ay)
}

cond {
  s = (s32[], f32[8], f32[8]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] constant(2)
  ROOT lt = pred[] compare(i, n), direction=LT
}
"""


def module_text(b: Builder, with_loop: bool, scheduled: bool = False) -> str:
    """The module; `scheduled` marks it is_scheduled=true (its text order is its schedule)."""
    lines = list(b.lines)
    roots = [name for name, _ in b.results]
    shapes = [s for _, s in b.results]
    extra = ""
    header = ("num_partitions=8" if b.global_ids else "replica_count=8") + (", is_scheduled=true" if scheduled else "")
    if with_loop:
        extra = WHILE.replace("GROUPS", "{{0,1,2,3},{4,5,6,7}}")
        for name in ("lp", "lq"):
            lines.append(f"  {name} = f32[8] parameter({len(b.params)})")
            b.params.append(name)
        lines.append("  lz = s32[] constant(0)\n  li = (s32[], f32[8], f32[8]) tuple(lz, lp, lq)")
        lines.append("  lw = (s32[], f32[8], f32[8]) while(li), condition=cond, body=body")
        lines.append("  la = f32[8] get-tuple-element(lw), index=1\n  lb = f32[8] get-tuple-element(lw), index=2")
        roots += ["la", "lb"]
        shapes += ["f32[8]", "f32[8]"]
        if b.global_ids:  # the loop's collectives in the global-id form too
            extra = extra.replace("replica_groups={{0,1,2,3},{4,5,6,7}}",
                                  "channel_id=CH, replica_groups={{0,1,2,3},{4,5,6,7}}, use_global_device_ids=true")
            for k in range(extra.count("channel_id=CH")):
                extra = extra.replace("channel_id=CH", f"channel_id={100 + k}", 1)
    lines.append(f"  ROOT root = ({', '.join(shapes)}) tuple({', '.join(roots)})")
    return f"HloModule random, {header}\n\n{REDUCTIONS}{extra}\nENTRY e {{\n" + "\n".join(lines) + "\n}\n"


COLLECTIVES = (Opcode.ALL_REDUCE, Opcode.ALL_GATHER, Opcode.REDUCE_SCATTER)


def collective_count(m, comp=None, opcodes=COLLECTIVES) -> int:
    comps = [comp] if comp is not None else m.computations
    return sum(1 for c in comps for i in c.instructions if i.opcode in opcodes)


OPTIONS = {
    "all-reduce-combiner": dict(combine_threshold_in_bytes=st.sampled_from([1 << 20, 64, 24]),
                                combine_threshold_count=st.sampled_from([256, 2, 3])),
    "all-gather-combiner": dict(combine_threshold_in_bytes=st.sampled_from([1 << 20, 64]),
                                combine_threshold_count=st.sampled_from([256, 2]),
                                combine_by_dim=st.booleans(), combine_different_dtypes=st.booleans(),
                                combine_while_loops=st.booleans()),
    "reduce-scatter-combiner": dict(combine_threshold_in_bytes=st.sampled_from([1 << 20, 16]),
                                    combine_threshold_count=st.sampled_from([256, 2]),
                                    combine_by_dim=st.booleans(), combine_while_loops=st.booleans()),
    "reduce-scatter-creator": {},
    "collective-fusion": dict(combine_by_dim=st.booleans(), combine_while_loops=st.booleans()),
}


@pytest.mark.parametrize("pass_name", sorted(OPTIONS))
@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_random_modules(pass_name, data):
    b, with_loop, scheduled = data.draw(collective_modules())
    text = module_text(b, with_loop, scheduled)
    options = {k: data.draw(v) for k, v in OPTIONS[pass_name].items()}
    m = parse_module(text)
    before = collective_count(m)
    loop_kinds = (Opcode.ALL_GATHER, Opcode.REDUCE_SCATTER)  # combine-while-loops governs these two
    body_before = collective_count(m, m.computation("body"), loop_kinds) if with_loop else 0
    p = lookup(pass_name)(**options)
    p.run(m)
    out = print_module(m)
    again = parse_module(out)
    assert print_module(again) == out
    assert verify_module(again) == []
    assert collective_count(again) <= before
    if with_loop and options.get("combine_while_loops") is False:
        assert collective_count(again, again.computation("body"), loop_kinds) == body_before
    report = verify_equivalent(text, out)
    assert report.ok, f"{pass_name}{options}\n{text}\n{out}\n{report.format()}"
