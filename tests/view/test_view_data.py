"""The data behind the view pages, without a browser: snapshots for golden modules, numbers
cross-checked against hlo_passes.stats, scope grouping, sharding pictures' data, the page's
self-containment, and the CLI hooks (`view`, `run --report`, `diff --html`)."""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from hlo_passes.cli.main import main as cli
from hlo_passes.ir.shape import ArrayShape
from hlo_passes.ir.sharding import Sharding, SubgroupKind
from hlo_passes.ir.types import PrimitiveType
from hlo_passes.parse.module_parser import parse_module
from hlo_passes.passes.manager import PassManager
from hlo_passes.passes.pass_base import ModulePass
from hlo_passes.passes.pipeline import parse_pipeline
from hlo_passes.stats import collective_kind, module_stats
from hlo_passes.view import diff_html, module_html
from hlo_passes.view.module_data import module_data
from hlo_passes.view.page import render_page
from hlo_passes.view.report_data import PassReport
from hlo_passes.view.scopes import group_instructions, split_op_name
from hlo_passes.view.sharding_data import bytes_on_device, mesh_shape, sharding_data, tile_shape_text

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOTS = Path(__file__).parent / "snapshots"

# One golden module per thing the page must draw right.
GOLDEN = {
    "megatron_mlp": "examples/megatron_mlp.hlo",  # global program, tiled + partially replicated shardings
    "dp_mlp_step": "examples/dp_mlp_step.hlo",  # per-device program, all-reduces, a shard_map body
    "all_collectives": "golden/corpus/shard_map_all_collectives/shard_map_all_collectives.xla_spmd.hlo",
    "collectives_2d": "golden/corpus/shard_map_collectives_2d/shard_map_collectives_2d.lowered.gspmd.hlo",
    "mesh_3d": "golden/corpus/sharded_3d_mesh/sharded_3d_mesh.lowered.gspmd.hlo",  # [2,1,2,2] replicated
    "scan_while": "golden/corpus/scan_while/scan_while.compiled.hlo",  # while body, fusions, stack frames
}


def _pretty(value, indent: str = "") -> str:
    """JSON with every value that fits in 110 characters on one line: short snapshots whose diffs
    name the field that changed."""
    flat = json.dumps(value, ensure_ascii=False)
    if len(flat) + len(indent) <= 110 or not isinstance(value, (list, dict)) or not value:
        return flat
    inner = indent + " "
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(k)}: {_pretty(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    return "[\n" + ",\n".join(inner + _pretty(v, inner) for v in value) + "\n" + indent + "]"


def _load(name: str):
    path = GOLDEN[name]
    return parse_module((ROOT / path).read_text(), path), path


# ------------------------------------------------------------------ snapshots --
@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_module_data_snapshot(name, request):
    """The whole page data of each golden module, as JSON; `--update-golden` rewrites it."""
    module, path = _load(name)
    actual = _pretty(module_data(module, source=path)) + "\n"
    snap = SNAPSHOTS / f"{name}.json"
    if request.config.getoption("--update-golden"):
        old = snap.read_text() if snap.exists() else ""
        if old != actual:
            snap.parent.mkdir(exist_ok=True)
            snap.write_text(actual)
            print("".join(difflib.unified_diff(old.splitlines(True), actual.splitlines(True), str(snap), str(snap),
                                               n=1))[:4000])
        return
    assert snap.exists(), f"{snap} is missing: run pytest {__file__} --update-golden"
    expected = snap.read_text()
    if expected != actual:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True), "expected",
                                            "actual", n=2))
        pytest.fail(f"view data of {path} changed (pytest --update-golden rewrites it):\n{diff[:6000]}")


# -------------------------------------------------------- numbers vs stats --
@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_summary_and_collectives_match_stats(name):
    module, _ = _load(name)
    data = module_data(module)
    stats = module_stats(module)
    sm = data["summary"]
    assert sm["instructions"] == stats.instructions == sum(len(c["names"]) for c in data["computations"])
    assert sm["flops"] == stats.flops
    assert dict((op, n) for op, n in sm["opcodes"]) == dict(stats.opcodes)
    assert {c["kind"]: (c["count"], c["bytes"]) for c in sm["collectives"]} == \
        {k: (stats.collective_count[k], stats.collective_bytes[k]) for k in stats.collective_count}
    # The per-instruction list adds up to the same numbers and names every collective once.
    count, size = Counter(), Counter()
    for rec in data["collectives"]:
        count[rec["kind"]] += 1
        size[rec["kind"]] += rec["bytes"]
    assert count == stats.collective_count and size == stats.collective_bytes
    listed = {(data["computations"][r["comp"]]["name"], data["computations"][r["comp"]]["names"][r["instr"]])
              for r in data["collectives"]}
    expected = {(i.parent.name, i.name) for i in module.all_instructions() if collective_kind(i) is not None}
    assert listed == expected


def test_every_instruction_sits_in_exactly_one_group():
    module, _ = _load("dp_mlp_step")
    for comp in module_data(module)["computations"]:
        members = [m for g in comp["groups"] for m in g["members"]]
        assert sorted(members) == list(range(len(comp["names"])))
        for i, g in enumerate(comp["group"]):
            assert i in comp["groups"][g]["members"]
        for gid, g in enumerate(comp["groups"]):
            for child in g["children"]:
                assert comp["groups"][child]["parent"] == gid


def test_operands_point_at_the_right_instructions():
    module, _ = _load("dp_mlp_step")
    data = module_data(module)
    for comp, c in zip(module.computations, data["computations"]):
        for instr in comp.instructions:
            i = c["names"].index(instr.name)
            assert [c["names"][o] for o in c["operands"][i]] == [o.name for o in instr.operands]
            assert data["opcodes"][c["opcode"][i]] == instr.opcode.value


# ------------------------------------------------------- parameter bytes --
def test_peak_parameter_bytes_of_a_global_program_are_its_shards():
    """megatron_mlp's ENTRY parameters and shardings, by hand: x f32[16,32] in [4,1] tiles,
    w1 f32[32,64] in [1,2], b1 f32[64] in [2], w2 f32[64,32] in [2,1], b2 f32[32] replicated."""
    module, _ = _load("megatron_mlp")
    data = module_data(module)
    shapes = {p.name: (p.shape.dims, p.sharding) for p in module.entry.parameters}
    expected = 4 * (16 * 32 // 4 + 32 * 64 // 2 + 64 // 2 + 64 * 32 // 2 + 32)
    assert all(s is not None for _, s in shapes.values())
    assert data["summary"]["peak_parameter_bytes"] == expected
    assert data["summary"]["parameter_bytes"] == [expected] * 8


def test_peak_parameter_bytes_agree_before_and_after_partitioning():
    """Two different readings of the same number: the global program's shards, and the
    per-device program spmd-partition makes of it (per-device shapes, counted whole)."""
    module, _ = _load("megatron_mlp")
    before = module_data(module)["summary"]["peak_parameter_bytes"]
    PassManager(parse_pipeline("spmd-partition{num-partitions=8}").passes).run(module)
    after = module_data(module)
    assert after["module"]["kind"] == "per-device"
    assert after["summary"]["peak_parameter_bytes"] == before


# --------------------------------------------------------------- sharding --
def test_sharding_data_lists_the_devices_of_each_tile():
    s = Sharding.tiled([[[0, 1]], [[2, 3]], [[4, 5]], [[6, 7]]], (SubgroupKind.REPLICATED,))
    table, out = {}, []
    rec = out[sharding_data(s, table, out)]
    assert rec["kind"] == "tiled" and rec["tiles"] == [4, 1] and rec["replicas"] == 2
    assert rec["grid"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert sharding_data(s, table, out) == 0 and len(out) == 1  # one record per distinct sharding


def test_sharding_data_of_a_transposed_tile_assignment():
    # devices=[2,4]<=[4,2]T(1,0): tile (r, c) is on device c*2 + r.
    module = parse_module("HloModule m\nENTRY e {\n  ROOT p = f32[8,8] parameter(0), "
                          "sharding={devices=[2,4]<=[4,2]T(1,0)}\n}\n")
    out: list = []
    rec = out[sharding_data(module.entry.root.sharding, {}, out)]
    assert rec["grid"] == [[0], [2], [4], [6], [1], [3], [5], [7]]
    assert tile_shape_text(module.entry.root.shape, module.entry.root.sharding) == "f32[4,2]"


def test_manual_and_tuple_shardings():
    module = parse_module("HloModule m\nENTRY e {\n  ROOT p = (f32[8], f32[4]) parameter(0), "
                          "sharding={{devices=[2,4]<=[8] last_tile_dims={manual}}, {replicated}}\n}\n")
    out: list = []
    rec = out[sharding_data(module.entry.root.sharding, {}, out)]
    assert rec["kind"] == "tuple"
    first, second = (out[e] for e in rec["elements"])
    assert first["manual"] == 4 and first["tiles"] == [2] and first["replicas"] == 1
    assert second["kind"] == "replicated"


def test_bytes_on_device():
    shape = parse_module("HloModule m\nENTRY e {\n  ROOT p = f32[10,8] parameter(0)\n}\n").entry.root.shape
    assert bytes_on_device(shape, Sharding.tiled([[0], [1], [2]]), 1) == 4 * 8 * 4  # ceil(10/3) rows, padded
    assert bytes_on_device(shape, Sharding.maximal(2), 2) == 320
    assert bytes_on_device(shape, Sharding.maximal(2), 0) == 0
    assert bytes_on_device(shape, Sharding.replicated(), 5) == 320


def test_mesh_shape():
    assert mesh_shape(8) == [2, 4] and mesh_shape(16) == [4, 4] and mesh_shape(6) == [2, 3]
    assert mesh_shape(7) == [1, 7] and mesh_shape(1) == [1, 1] and mesh_shape(64) == [8, 8]


# ----------------------------------------------------------------- scopes --
def test_split_op_name_keeps_brackets_whole():
    assert split_op_name("jit(f)/jvp(g/h)/dot") == ["jit(f)", "jvp(g/h)", "dot"]
    assert split_op_name("params['a/b'][0]") == ["params['a/b'][0]"]


def test_grouping_drops_the_common_prefix_and_places_unscoped_ops_by_their_users():
    names = ["jit(f)/layer0/dot", "jit(f)/layer0/add", None, "jit(f)/layer1/mul", "jit(f)/transpose(layer1)/mul"]
    ops = [[], [0], [], [1, 2], [3]]
    tree = group_instructions(names, ["dot", "add", "constant", "multiply", "multiply"], [False] * 5, ops)
    label = lambda i: tree.groups[tree.group_of[i]].label  # noqa: E731
    assert [label(i) for i in range(5)] == ["layer0", "layer0", "layer1", "layer1", "transpose(layer1)"]
    assert tree.groups[0].label == "" and len(tree.groups[0].children) == 3  # jit(f) was dropped


def test_grouping_nests_parameters_by_pytree_path():
    names = [f"params['blocks'][{b}]['w{k}']" for b in range(3) for k in range(4)] + ["jit(f)/add"]
    n = len(names)
    tree = group_instructions(names, ["parameter"] * (n - 1) + ["add"], [True] * (n - 1) + [False],
                              [[] for _ in range(n - 1)] + [[0, 1]])
    params = tree.groups[tree.groups[0].children[0]]
    assert params.kind == "parameters"
    labels = sorted(tree.groups[c].label for c in params.children)
    assert labels == ["[0]", "[1]", "[2]"]  # "parameters/params/['blocks']" merged into one chain
    assert params.label == "parameters/params/['blocks']"
    assert tree.groups[tree.group_of[4]].scope == "params['blocks'][1]"


def test_grouping_chunks_big_flat_groups_by_dataflow():
    # 200 independent chains of 3 ops (an optimizer update per parameter): chunks keep chains whole.
    names, ops = [], []
    for k in range(200):
        base = len(names)
        names += ["jit(f)/mul", "jit(f)/add", "jit(f)/sqrt"]
        ops += [[], [base], [base + 1]]
    tree = group_instructions(names, ["multiply", "add", "sqrt"] * 200, [False] * 600, ops,
                              max_children=48, chunk_size=32)
    for g in tree.groups:
        assert len(g.members) + len(g.children) <= 48
    for k in range(200):
        assert len({tree.group_of[3 * k + j] for j in range(3)}) == 1


# ------------------------------------------------------------------- page --
def test_page_is_self_contained():
    module, path = _load("dp_mlp_step")
    html = module_html(module, source=path)
    assert not re.search(r"<script[^>]+src=|<link\b|@import|url\(\s*['\"]?(https?:)?//", html, re.I)
    assert "sourceMappingURL" not in html
    assert html.count("<script") == 3  # data, dagre, ours


def test_page_data_cannot_close_its_script_element():
    html = render_page("view", "t", {"x": "</script><script>alert(1)</script><!--"})
    data = html.split('id="page-data">', 1)[1].split("</script>", 1)[0]
    assert json.loads(data) == {"x": "</script><script>alert(1)</script><!--"}


def test_vendored_dagre_is_the_recorded_release():
    path = ROOT / "hlo_passes" / "view" / "vendor" / "dagre.min.js"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    readme = (path.parent / "README.md").read_text()
    assert digest in readme and "3.1.3" in readme and "MIT" in readme


def test_metadata_with_c_escaped_quotes_is_read():
    module = parse_module("HloModule m\nENTRY e {\n  ROOT p = f32[2] parameter(0), "
                          "metadata={op_name=\"params[\\'w\\']\"}\n}\n")
    data = module_data(module)
    assert data["strings"] == ["params['w']"] and data["unreadable"] == {}


# -------------------------------------------------------------------- CLI --
def test_cli_view_writes_a_page(tmp_path, capsys):
    out = tmp_path / "v.html"
    assert cli(["view", str(ROOT / GOLDEN["dp_mlp_step"]), "-o", str(out)]) == 0
    html = out.read_text()
    assert html.startswith("<!doctype html>") and '"name":"jit__fun"' in html


def test_cli_view_of_bad_input_writes_nothing(tmp_path, capsys):
    bad = tmp_path / "bad.hlo"
    bad.write_text("HloModule m\nENTRY e {\n  ROOT p = f32[2] frobnicate()\n}\n")
    out = tmp_path / "v.html"
    assert cli(["view", str(bad), "-o", str(out)]) == 2
    assert not out.exists()
    assert "bad.hlo:3" in capsys.readouterr().err


def test_cli_view_of_a_dump_directory(tmp_path, capsys):
    dump = tmp_path / "dump"
    dump.mkdir()
    (dump / "module_0007.jit_step.before_optimizations.txt").write_text((ROOT / GOLDEN["megatron_mlp"]).read_text())
    out = tmp_path / "v.html"
    assert cli(["view", str(dump), "--module", "jit_step", "-o", str(out)]) == 0
    assert "module_0007.jit_step.before_optimizations.txt" in out.read_text()


def test_cli_run_report_and_diff_html(tmp_path, capsys):
    src = str(ROOT / GOLDEN["megatron_mlp"])
    part, report, diff = tmp_path / "p.hlo", tmp_path / "r.html", tmp_path / "d.html"
    assert cli(["run", src, "--passes=spmd-partition,collective-fusion", "--num-partitions=8",
                "--report", str(report), "-o", str(part)]) == 0
    data = json.loads(report.read_text().split('id="page-data">', 1)[1].split("</script>", 1)[0])
    assert [p["name"] for p in data["passes"]] == ["spmd-partition{num-partitions=8}", "collective-fusion"]
    assert [p["changed"] for p in data["passes"]] == [True, False]
    final = parse_module(part.read_text())
    assert data["passes"][-1]["after"]["collectives"] == {k: [v, module_stats(final).collective_bytes[k]]
                                                          for k, v in module_stats(final).collective_count.items()}
    assert data["final"]["summary"]["instructions"] == module_stats(final).instructions
    assert not data["passes"][0]["diff"]["equal"] and data["passes"][1]["diff"]["equal"]
    assert cli(["diff", src, str(part), "--html", str(diff)]) == 1  # they differ
    assert "main.1 -> main.1_spmd" in diff.read_text()


class _Breaks(ModulePass):
    name = "breaks-the-root"
    summary = "test pass: a root shape that no longer follows from its operands"

    def run(self, module):
        module.entry.root.shape = ArrayShape(PrimitiveType.F32, (5,))
        return True


def test_report_of_a_failed_pipeline_names_the_failure():
    module, path = _load("dp_mlp_step")
    report = PassReport(path, "dce,breaks-the-root")
    manager = PassManager(parse_pipeline("dce").passes + [_Breaks()], verify_each=True, dump=report.observe)
    with pytest.raises(Exception) as info:
        manager.run(module)
    html = report.html(manager, module, error=str(info.value))
    data = json.loads(html.split('id="page-data">', 1)[1].split("</script>", 1)[0])
    assert "breaks-the-root" in data["error"]
    assert [p["name"] for p in data["passes"]] == ["dce", "breaks-the-root"]


def test_diff_html_of_equal_modules():
    module, path = _load("mesh_3d")
    html = diff_html(module, _load("mesh_3d")[0], "a", "b")
    assert '"equal":true' in html
