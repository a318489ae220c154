"""verify's oracle for a global original with a manual region: XLA's partition of it, except for
the outputs that need no device of their own (no manual region, collective or device id in what
they are computed from), which are computed on one device, unpartitioned.

Why: XLA's partitioner computed such an output wrong beside a manual region.  SPMD fuzz seed
10085 (sparse), reduced: a dynamic-update-slice writes row 2 of a [3,1] value whose rows are
tiled unevenly over two pairs of devices; XLA's partition of the original leaves the row
unwritten, and `verify` blamed our (right) partition.  The values are judged here against
numpy too."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hlo_passes import parse_module, print_module
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.opcode import Opcode
from hlo_passes.passes.spmd.spmd_partitioner import SpmdPartitioner
from hlo_passes.runtime import verify_equivalent
from hlo_passes.runtime.partitioned import run_xla_spmd
from hlo_passes.runtime.verify import random_inputs

TEXT = (Path(__file__).parent / "dumps" / "data" / "dus_beside_manual_region_10085.hlo").read_text()


def _partitioned(text: str) -> str:
    module = parse_module(text)
    SpmdPartitioner(num_partitions=4).run(module)
    return print_module(module)


def _truth(inputs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    p0, p2, p4 = inputs
    dus = p0.copy()
    dus[2, 0] = p4[0, 0]  # row 3 clamped to 2, the last row of 3
    return -p2, dus


def test_an_output_beside_a_manual_region_is_judged_by_its_unpartitioned_value():
    inputs = random_inputs(parse_module(TEXT), seed=0)
    report = verify_equivalent(TEXT, _partitioned(TEXT), inputs=inputs)
    assert report.ok, report.format()
    assert any("output 1 needs no device of its own" in n for n in report.notes), report.notes
    region, dus = _truth(inputs)
    assert np.array_equal(report.expected[1], dus)
    assert np.array_equal(report.actual[1], dus) and np.array_equal(report.actual[0], region)


def test_xlas_partition_of_that_output_is_wrong():
    """The reason for the rule (a canary: it fails when a jaxlib fixes XLA's partitioner, and the
    rule can then go)."""
    inputs = random_inputs(parse_module(TEXT), seed=0)
    outputs, _, _ = run_xla_spmd(parse_module(TEXT), inputs, 4, None, [])
    region, dus = _truth(inputs)
    assert np.array_equal(outputs[0], region)
    assert not np.array_equal(outputs[1], dus)


def test_a_wrong_value_of_such_an_output_is_still_caught():
    """Our partition with its second output negated: the one-device oracle tells it apart."""
    module = parse_module(_partitioned(TEXT))
    root = module.entry.root
    dus = root.operands[1]
    negated = module.entry.add(Instruction(Opcode.NEGATE, dus.shape, [dus], name="negated"))
    root.set_operand(1, negated)
    report = verify_equivalent(TEXT, print_module(module))
    assert [s.ok for s in report.outputs] == [True, False], report.format()


def test_an_output_ordered_after_the_region_keeps_xlas_oracle():
    """A control edge from inside the region to the dynamic-update-slice puts the region in what
    that output is computed from: it is not cut out, XLA's partition stays its oracle."""
    text = TEXT.replace("dus = f32[3,1] dynamic-update-slice(p0, p4, i, z)\n", "").replace(
        "  ROOT out =", "  dus = f32[3,1] dynamic-update-slice(p0, p4, i, z), control-predecessors={neg}\n  ROOT out =")
    report = verify_equivalent(text, _partitioned(text))
    assert not any("needs no device" in n for n in report.notes), report.notes


def test_control_edges_among_cut_instructions_are_dropped_with_them():
    """A control edge between two instructions of the region, which output 1's slice cuts away
    together: the cut detaches both ends."""
    text = TEXT.replace(
        "  leave = f32[16,2] custom-call(neg)",
        "  neg2 = f32[16,2] negate(neg), control-predecessors={neg}, sharding={devices=[2,1,2]0,2,1,3 last_tile_dims={manual}}\n"
        "  leave = f32[16,2] custom-call(neg2)")
    inputs = random_inputs(parse_module(text), seed=0)
    report = verify_equivalent(text, _partitioned(text), inputs=inputs)
    assert report.ok, report.format()
    assert any("output 1 needs no device of its own" in n for n in report.notes), report.notes
