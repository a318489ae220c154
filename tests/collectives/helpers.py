"""Helpers for the collective-pass tests: small modules, running a pass, and the oracle
(XLA running the input and the output on the devices the module names, every device its own
inputs)."""

from hlo_passes.ir import Opcode
from hlo_passes.parse.module_parser import parse_module
from hlo_passes.passes.registry import lookup
from hlo_passes.printer import print_module
from hlo_passes.runtime import verify_equivalent

ADD = "add { a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT s = f32[] add(a, b) }\n"
SUM = "sum { x = f32[] parameter(0)\n y = f32[] parameter(1)\n ROOT z = f32[] add(y, x) }\n"
MAX = "mx { a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT s = f32[] maximum(a, b) }\n"
ADD_S32 = "add_s32 { a = s32[] parameter(0)\n b = s32[] parameter(1)\n ROOT s = s32[] add(a, b) }\n"
G4 = "replica_groups={{0,1,2,3},{4,5,6,7}}"
G2 = "replica_groups={{0,1},{2,3},{4,5},{6,7}}"


def module(body: str, header: str = "replica_count=8", extra: str = "") -> str:
    return f"HloModule m, {header}\n\n{ADD}\n{SUM}\n{MAX}\n{ADD_S32}\n{extra}\nENTRY e {{\n{body}\n}}\n"


def run(pass_name: str, text: str, *, numerics: bool = True, **options):
    """Run one pass; check the output prints, parses back, and (unless `numerics=False`)
    computes what the input computes on every device."""
    m = parse_module(text)
    p = lookup(pass_name)(**options)
    changed = p.run(m)
    out = print_module(m)
    assert print_module(parse_module(out)) == out
    if numerics:
        report = verify_equivalent(text, out)
        assert report.ok, report.format()
    return changed, m, p


def ops(m, opcode, comp=None):
    comp = comp or m.entry
    return [i for i in comp.instructions if i.opcode is opcode]


def merged_names(m, opcode, comp=None) -> list[list[str]]:
    """For each collective of `opcode`, the names of what it reads (through transposes and the
    packing of reduce-scatter-combiner), sorted: which members were merged together."""
    groups = []
    for c in ops(m, opcode, comp):
        groups.append(sorted(_sources(op) for op in c.operands))
    return sorted(groups)


def _sources(x) -> str:
    while x.opcode in (Opcode.TRANSPOSE, Opcode.RESHAPE, Opcode.SLICE):
        x = x.operands[0]
    if x.opcode is Opcode.CONCATENATE:
        return "+".join(sorted(_sources(o) for o in x.operands))
    return x.name
