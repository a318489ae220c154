"""Numerical verification: equal modules verify, deliberate corruptions are
caught, partitioned modules are judged against their unpartitioned originals
(XLA's execution of the original is the oracle)."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hlo_passes.runtime import verify_equivalent
from hlo_passes.runtime.verify import compare_arrays, default_tolerance

ROOT = Path(__file__).resolve().parents[1]

ADD = "add { a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT s = f32[] add(a, b) }\n"

ORIGINAL = """HloModule m
ENTRY e {
  x = f32[8,16] parameter(0), sharding={devices=[1,4]<=[4]}
  w = f32[16,4] parameter(1), sharding={devices=[4,1]<=[4]}
  d = f32[8,4] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  c = f32[] constant(2)
  b = f32[8,4] broadcast(c), dimensions={}
  ROOT r = f32[8,4] multiply(d, b), sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
}
"""

# Contracting dim split 4 ways: partial dots, all-reduce, then each device keeps its row half.
PARTITIONED = """HloModule m, num_partitions=4
""" + ADD + """
ENTRY e {
  x = f32[8,4] parameter(0), sharding={devices=[1,4]<=[4]}
  w = f32[4,4] parameter(1), sharding={devices=[4,1]<=[4]}
  d = f32[8,4] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ar = f32[8,4] all-reduce(d), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add
  table = s32[4] constant({0, 0, 4, 4})
  pid = u32[] partition-id()
  i = s32[1] dynamic-slice(table, pid), dynamic_slice_sizes={1}
  off = s32[] reshape(i)
  zero = s32[] constant(0)
  rows = f32[4,4] dynamic-slice(ar, off, zero), dynamic_slice_sizes={4,4}
  c = f32[] constant(2)
  b = f32[4,4] broadcast(c), dimensions={}
  ROOT r = f32[4,4] multiply(rows, b), sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
}
"""


def test_identical_modules_verify():
    assert verify_equivalent(ORIGINAL, ORIGINAL).ok


def test_partitioned_module_verifies_against_original():
    report = verify_equivalent(ORIGINAL, PARTITIONED)
    assert report.ok, report.format()
    assert "partitioned on 4 devices" in report.format()


@pytest.mark.parametrize("corruption", [
    ("constant(2)\n  b = f32[4,4]", "constant(3)\n  b = f32[4,4]"),                   # a changed constant
    ("ar = f32[8,4] all-reduce(d), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add",
     "ar = f32[8,4] copy(d)"),                                                         # a dropped all-reduce
    ("constant({0, 0, 4, 4})", "constant({0, 0, 4, 3})"),                              # a wrong dynamic-slice offset
    ("constant({0, 0, 4, 4})", "constant({4, 4, 0, 0})"),                              # swapped output shards
])
def test_corruptions_are_caught(corruption):
    old, new = corruption
    assert old in PARTITIONED
    report = verify_equivalent(ORIGINAL, PARTITIONED.replace(old, new))
    assert not report.ok, report.format()


UNEVEN_ORIGINAL = """HloModule m
ENTRY e {
  x = f32[10,6] parameter(0), sharding={devices=[4,1]<=[4]}
  ROOT n = f32[10,6] negate(x), sharding={devices=[4,1]<=[4]}
}
"""
UNEVEN_PARTITIONED = """HloModule m, num_partitions=4
ENTRY e {
  x = f32[3,6] parameter(0), sharding={devices=[4,1]<=[4]}
  ROOT n = f32[3,6] negate(x), sharding={devices=[4,1]<=[4]}
}
"""


def test_uneven_shards_are_padded_and_cropped():
    assert verify_equivalent(UNEVEN_ORIGINAL, UNEVEN_PARTITIONED).ok
    wrong = UNEVEN_PARTITIONED.replace("negate(x)", "abs(x)").replace("ROOT n", "ROOT n")
    assert not verify_equivalent(UNEVEN_ORIGINAL, wrong).ok


REPLICA = """HloModule m, replica_count=4
""" + ADD + """
ENTRY e {
  x = f32[8] parameter(0)
  ROOT r = f32[8] all-reduce(x), replica_groups={{0,1},{2,3}}, to_apply=add
}
"""


def test_replica_programs_compare_per_replica():
    assert verify_equivalent(REPLICA, REPLICA).ok
    regrouped = REPLICA.replace("{{0,1},{2,3}}", "{{0,2},{1,3}}")
    assert not verify_equivalent(REPLICA, regrouped).ok


@pytest.mark.parametrize("etype", ["pred", "s8", "s32", "u8", "u32", "s64", "f16", "bf16", "f32", "f64",
                                   "c64", "f8e4m3fn"])
def test_every_element_type_runs(etype):
    op = "not" if etype == "pred" else ("negate" if etype[0] in "fcb" or etype.startswith("s") else "copy")
    text = f"HloModule m\nENTRY e {{\n  x = {etype}[4] parameter(0)\n  ROOT y = {etype}[4] {op}(x)\n}}\n"
    assert verify_equivalent(text, text).ok
    if etype not in ("pred",) and op != "copy":
        other = text.replace(f"{op}(x)", "copy(x)")
        assert not verify_equivalent(text, other).ok


def test_nan_positions_must_match():
    want = np.array([1.0, np.nan, 3.0], np.float32)
    assert compare_arrays("0", want, want.copy()).ok
    assert not compare_arrays("0", want, np.array([1.0, 2.0, 3.0], np.float32)).ok
    assert not compare_arrays("0", np.array([np.inf], np.float32), np.array([-np.inf], np.float32)).ok
    assert default_tolerance(np.dtype("int32")) == (0.0, 0.0)


def cli(*args):
    return subprocess.run([sys.executable, "-m", "hlo_passes", *args], capture_output=True, text=True, cwd=ROOT)


def test_cli_exit_codes(tmp_path):
    a, b, bad = tmp_path / "a.hlo", tmp_path / "b.hlo", tmp_path / "bad.hlo"
    a.write_text(ORIGINAL)
    b.write_text(PARTITIONED)
    bad.write_text(PARTITIONED.replace("constant({0, 0, 4, 4})", "constant({4, 4, 0, 0})"))
    ok = cli("verify", str(a), str(b))
    assert ok.returncode == 0 and "EQUIVALENT" in ok.stdout
    mismatch = cli("verify", str(a), str(bad))
    assert mismatch.returncode == 1 and "MISMATCH" in mismatch.stdout and "first mismatch" in mismatch.stdout
    broken = tmp_path / "broken.hlo"
    broken.write_text(ORIGINAL.replace("dot(x, w)", "dot(x, q)"))
    usage = cli("verify", str(a), str(broken))
    assert usage.returncode == 2 and "'q' is not defined" in usage.stderr and "Traceback" not in usage.stderr
    saved = tmp_path / "outs.npz"
    assert cli("verify", str(a), str(bad), "--save-outputs", str(saved)).returncode == 1
    data = np.load(saved)
    assert data["expected_0"].shape == data["actual_0"].shape == (8, 4)
    assert not np.allclose(data["expected_0"], data["actual_0"])
    run = cli("exec", str(a))
    assert run.returncode == 0 and run.stdout.startswith("output 0: float32[8, 4]")
