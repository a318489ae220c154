"""Per-device SPMD programs as replica programs, and a device-by-device comparison.

The modules XLA compiles after SPMD partitioning (and the ones a compile-time
rewrite produces from them) are per-device programs: per-device shapes,
collectives with explicit device groups, no logical shardings.  Two such
modules are equivalent when every device computes the same outputs from the
same inputs.  `compare_per_device` (used by jax_hook) runs both on N CPU devices
with the same random inputs per device (identical on every device for the
parameters marked replicated) and compares every device's outputs.

`execute` runs a program as the equivalent `replica_count=N` program
(`as_replica_program`: partition-id becomes replica-id, every collective's device
groups are spelled out as replica groups without a channel).  `verify_equivalent`
runs per-device programs with manual shardings instead (partitioned.py), where XLA
itself interprets the groups, and uses this form only when XLA's partitioner
rejects the manual program.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hlo_passes.ir.builder import Builder
from hlo_passes.ir.collective_groups import participant_groups
from hlo_passes.ir.module import Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.replica_groups import ReplicaGroups
from hlo_passes.parse.module_parser import parse_module
from hlo_passes.printer import print_module
from hlo_passes.runtime import xla_backend
from hlo_passes.runtime.inputs import per_device_inputs
from hlo_passes.runtime.recompile import make_fresh_program, needs_fresh_program

_GROUPED = {Opcode.ALL_REDUCE, Opcode.ALL_GATHER, Opcode.REDUCE_SCATTER, Opcode.ALL_TO_ALL,
            Opcode.ALL_REDUCE_START, Opcode.ALL_GATHER_START}
_PAIRED = {Opcode.COLLECTIVE_PERMUTE, Opcode.COLLECTIVE_PERMUTE_START}


@dataclass
class PerDeviceReport:
    ok: bool
    num_devices: int
    mismatches: list[str] = field(default_factory=list)
    max_abs_error: float = 0.0

    def format(self) -> str:
        if self.ok:
            return f"equal on all {self.num_devices} devices (max abs error {self.max_abs_error:.3g})"
        return "\n".join([f"differs on {self.num_devices} devices:"] + self.mismatches[:10])


def compare_per_device(original: str, rewritten: str, *, num_devices: int,
                       replicated: list[bool] | None = None, seed: int = 0,
                       rtol: float = 1e-5, atol: float = 1e-5) -> PerDeviceReport:
    """Run both per-device programs on `num_devices` devices with the same inputs; compare outputs."""
    inputs = random_inputs(original, num_devices, replicated=replicated, seed=seed)
    want = execute(original, inputs, num_devices)
    got = execute(rewritten, inputs, num_devices)
    report = PerDeviceReport(True, num_devices)
    for device, (w_outs, g_outs) in enumerate(zip(want, got)):
        if len(w_outs) != len(g_outs):
            report.mismatches.append(f"device {device}: {len(w_outs)} outputs vs {len(g_outs)}")
            continue
        for i, (w, g) in enumerate(zip(w_outs, g_outs)):
            if w.shape != g.shape or w.dtype != g.dtype:
                report.mismatches.append(f"device {device} output {i}: {w.dtype}{list(w.shape)} vs "
                                         f"{g.dtype}{list(g.shape)}")
                continue
            if w.size == 0:
                continue
            wf, gf = w.astype(np.float64), g.astype(np.float64)
            err = float(np.nanmax(np.abs(wf - gf))) if np.issubdtype(wf.dtype, np.floating) else 0.0
            report.max_abs_error = max(report.max_abs_error, err)
            if not np.allclose(gf, wf, rtol=rtol, atol=atol, equal_nan=True):
                report.mismatches.append(f"device {device} output {i}: max abs error {err:.3g}")
    report.ok = not report.mismatches
    return report


def random_inputs(text: str, num_devices: int, *, replicated: list[bool] | None = None,
                  seed: int = 0) -> list[list[np.ndarray]]:
    """`inputs[leaf][device]`: random inputs per device (see inputs.py for the values),
    identical on every device for the parameters flagged in `replicated`."""
    return per_device_inputs(parse_module(text), num_devices, replicated=replicated, seed=seed)


SPLIT_IN_MANUAL_MODE = frozenset({Opcode.ALL_REDUCE, Opcode.ALL_GATHER})
SPLIT_ALWAYS = frozenset({Opcode.ALL_GATHER})


def has_variadic(module: Module, opcodes: frozenset[Opcode]) -> bool:
    """Does `module` hold a collective of `opcodes` with several operands?"""
    return any(i.opcode in opcodes and len(i.operands) > 1 for i in module.all_instructions())


def split_variadic_collectives(module: Module, opcodes: frozenset[Opcode]) -> None:
    """One collective per operand (same groups and attributes, fresh channel ids) in place of
    each variadic all-reduce / all-gather of `opcodes`: the same computation, in the form XLA
    CPU runs right.

    Why: XLA's manual mode rejects variadic all-reduces; and XLA CPU constrains the layout of a
    single all-gather so that the gathered dimension is major (its runtime concatenates the
    devices' buffers) but not that of a variadic one, whose layout it may propagate from a
    neighbouring transpose; the devices' pieces then land in the wrong places (seen in jax
    0.12 on a JAX-program fuzz seed, 2014).  Verification asks what a program means, so it
    runs the split form."""
    for comp in module.computations:
        for instr in list(comp.instructions):
            if instr.opcode not in opcodes or len(instr.operands) < 2:
                continue
            b = Builder(comp, before=instr)
            parts = []
            for k, operand in enumerate(instr.operands):
                shape = instr.shape.elements[k] if instr.opcode is Opcode.ALL_GATHER else operand.shape
                part = b.op(instr.opcode, shape, [operand], name=instr.name, called=dict(instr.called))
                for key, slot in instr.attributes.items():
                    part.attributes[key] = slot
                if instr.sharding is not None and instr.sharding.is_tuple:
                    part.sharding = instr.sharding.element(k)
                if "channel_id" in instr.attributes:
                    part.set_attr("channel_id", module.new_channel_id())
                parts.append(part)
            comp.replace(instr, b.tuple(parts))


def as_replica_program(text: str, num_devices: int, *, split_all_gathers: bool = True) -> str:
    """A per-device `num_partitions=N` program as the equivalent `replica_count=N` program
    (and, when XLA already compiled it, as a fresh program: recompile.py), its variadic
    all-gathers split (`split_variadic_collectives`; `split_all_gathers=False` keeps them, to
    show XLA CPU's fault)."""
    module = parse_module(text)
    fresh = needs_fresh_program(module) and make_fresh_program(module)
    split = split_all_gathers and has_variadic(module, SPLIT_ALWAYS)
    if split:
        split_variadic_collectives(module, SPLIT_ALWAYS)
    if module.replica_count > 1 and module.num_partitions == 1:
        return print_module(module) if fresh or split else text  # already a replica program
    module.num_partitions = num_devices
    for instr in module.all_instructions():
        if instr.opcode is Opcode.PARTITION_ID:
            instr.opcode = Opcode.REPLICA_ID
        elif instr.opcode in _GROUPED:
            instr.set_attr("replica_groups", ReplicaGroups.explicit(participant_groups(instr, module)))
            instr.remove_attr("channel_id")
            instr.remove_attr("use_global_device_ids")
        elif instr.opcode in _PAIRED:
            instr.remove_attr("channel_id")
    module.set_header_attr("replica_count", num_devices)
    module.attributes.pop("num_partitions", None)
    return print_module(module)


def execute(text: str, inputs: list[list[np.ndarray]], num_devices: int) -> list[list[np.ndarray]]:
    """Outputs per device: result[device] = the flat list of that device's outputs.

    Runs the `replica_count=N` form of the program (see `as_replica_program`)."""
    exe = xla_backend.compile_hlo(as_replica_program(text, num_devices), num_replicas=num_devices)
    return exe.run(inputs)
