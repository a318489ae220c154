"""Whole-corpus checks with XLA as the oracle:

* XLA's own SPMD-partitioned module of every multi-device corpus program
  (jit with shardings, shard_map, pmap) verifies against the unpartitioned
  program: parameter shardings come from the unpartitioned module (JAX 0.12
  drops them from the partitioned one), result shardings from what JAX's
  compile reported (meta.json `output_shardings`, written by make_corpus.py;
  XLA may tile a result finer than the program asked).  Programs with manual
  regions run through XLA's own SPMD partitioner on their device count;
* `collective-fusion` runs on every per-device corpus program (XLA's
  partitioned modules) and on our own `spmd-partition` output of every
  multi-device program; the result computes what its input computes on every
  device.
"""

import json
from pathlib import Path

import pytest

from hlo_passes import parse_module, print_module
from hlo_passes.ir.sharding import Sharding
from hlo_passes.parse.attribute_reader import reader_for
from hlo_passes.passes.manager import PassManager
from hlo_passes.runtime import VerificationError, verify_equivalent

CORPUS = Path(__file__).resolve().parents[1] / "golden" / "corpus"
XLA_SPMD = sorted(CORPUS.glob("*/*.xla_spmd.hlo"))
LOWERED = sorted(p for p in CORPUS.glob("*/*.lowered.gspmd.hlo")
                 if json.loads((p.parent / "meta.json").read_text()).get("num_devices", 1) > 1)


read_sharding = reader_for("sharding")


def meta(path: Path) -> dict:
    return json.loads((path.parent / "meta.json").read_text())


def result_sharding(path: Path, module) -> Sharding:
    """The ROOT's logical sharding as JAX's compile reported it, one entry per output leaf."""
    leaves = [read_sharding(s) for s in meta(path)["output_shardings"]]
    return Sharding.tuple_of(leaves) if module.entry.root.shape.is_tuple else leaves[0]


@pytest.mark.parametrize("path", XLA_SPMD, ids=lambda p: p.parent.name)
def test_xla_partitioned_module_verifies_against_original(path):
    program = path.parent.name
    lowered = (path.parent / f"{program}.lowered.gspmd.hlo").read_text()
    partitioned = parse_module(path.read_text())
    report = verify_equivalent(lowered, partitioned, num_devices=meta(path)["num_devices"],
                               root_sharding=result_sharding(path, partitioned))
    assert report.ok, report.format()


@pytest.mark.parametrize("path", XLA_SPMD, ids=lambda p: p.parent.name)
def test_shardy_and_gspmd_lowerings_compute_the_same(path):
    """JAX's two lowerings of one program, each run by XLA on its devices (the Shardy one
    through XLA's Shardy partitioner, or through our Shardy import where XLA cannot take it)."""
    program = path.parent.name
    shardy = (path.parent / f"{program}.lowered.shardy.hlo").read_text()
    gspmd = (path.parent / f"{program}.lowered.gspmd.hlo").read_text()
    report = verify_equivalent(gspmd, shardy, num_devices=meta(path)["num_devices"])
    assert report.ok, report.format()


@pytest.mark.parametrize("path", XLA_SPMD, ids=lambda p: p.parent.name)
def test_collective_fusion_on_every_partitioned_program(path):
    text = path.read_text()
    module = parse_module(text)
    PassManager.from_pipeline("collective-fusion", verify_each=True).run(module)
    out = print_module(module)
    n = json.loads((path.parent / "meta.json").read_text()).get("num_devices", 8)
    try:
        report = verify_equivalent(text, out, num_devices=n)
    except VerificationError as e:
        pytest.fail(str(e))
    assert report.ok, report.format()


@pytest.mark.parametrize("path", LOWERED, ids=lambda p: p.parent.name)
def test_collective_fusion_on_our_partitioned_programs(path):
    """Our partitioner spells collectives differently from XLA's (sharded_shape_ops: three
    gathers over dimension 1 that all-gather-combiner once merged into a variadic all-gather
    XLA CPU lays out wrongly), so fusion is checked on its output too."""
    n = meta(path)["num_devices"]
    module = parse_module(path.read_text())
    PassManager.from_pipeline(f"spmd-partition{{num-partitions={n}}}").run(module)
    partitioned = print_module(module)
    PassManager.from_pipeline("collective-fusion", verify_each=True).run(module)
    try:
        report = verify_equivalent(partitioned, print_module(module), num_devices=n)
    except VerificationError as e:
        pytest.fail(str(e))
    assert report.ok, report.format()
