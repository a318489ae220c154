"""Programs whose partition by XLA's own partitioner (jaxlib 0.12) computes a wrong value, and
ours the right one.  Kept as regression cases: the oracle is XLA's run of the unpartitioned
module, which is right.

conv_kernel_gradient_2x2x2.hlo: the kernel gradient of a 3x3 SAME convolution whose input is
tiled along a spatial dim over the 2 devices of axis `y` of a 2x2x2 mesh (the other 4 hold
copies).  XLA's partition sums the partial kernel gradients over all 8 devices, 4 times the
answer (found by the Shardy probe of 2026-11-27; the same program on a 4x2, 2x4 or 8 mesh is
right).  Ours sums over the `y` pairs only."""

from __future__ import annotations

from pathlib import Path

import pytest

from hlo_passes import parse_module
from hlo_passes.ir.opcode import Opcode
from tests.spmd.partitioning import partition_verified

CASES = Path(__file__).parent / "xla_wrong_cases"


@pytest.mark.parametrize("name", sorted(p.name for p in CASES.glob("*.hlo")))
def test_partitioned_where_xlas_own_partition_is_wrong(name):
    module, out = partition_verified((CASES / name).read_text(), 8)
    sums = [i for i in parse_module(out).all_instructions() if i.opcode is Opcode.ALL_REDUCE]
    assert sums and all(len(group) == 2 for s in sums for group in s.attr("replica_groups").groups)
