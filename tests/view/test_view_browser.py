"""The pages as a user sees them: rendered by headless Chromium (DevTools protocol over a pipe),
clicked with real mouse events, and read back from the DOM.

Skipped when no Chromium is installed, except under CI (CI=true), where `.ci/run` installs it
and a missing browser must fail rather than hide these tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hlo_passes.cli.main import main as cli
from hlo_passes.diff import diff_modules
from hlo_passes.parse.module_parser import parse_module
from hlo_passes.passes.manager import PassManager
from hlo_passes.passes.pipeline import parse_pipeline
from hlo_passes.stats import collective_kind, module_stats
from hlo_passes.view import diff_html, module_html
from hlo_passes.view.headless import Browser, find_chromium

ROOT = Path(__file__).resolve().parents[2]
FILES = {
    "megatron_mlp": "examples/megatron_mlp.hlo",
    "dp_mlp_step": "examples/dp_mlp_step.hlo",
    "all_collectives": "golden/corpus/shard_map_all_collectives/shard_map_all_collectives.xla_spmd.hlo",
    "collectives_2d": "golden/corpus/shard_map_collectives_2d/shard_map_collectives_2d.lowered.gspmd.hlo",
    "megatron_spmd": "golden/corpus/sharded_megatron_mlp/sharded_megatron_mlp.xla_spmd.hlo",
    "scan_while": "golden/corpus/scan_while/scan_while.compiled.hlo",
}


@pytest.fixture(scope="module")
def browser():
    if find_chromium() is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is missing under CI: .ci/run installs it (apt-get install chromium)")
        pytest.skip("no Chromium on PATH: the browser tests need it (apt-get install chromium)")
    with Browser() as b:
        yield b


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """Each golden module's page, written once."""
    out = tmp_path_factory.mktemp("pages")
    paths = {}
    for name, rel in FILES.items():
        module = parse_module((ROOT / rel).read_text(), rel)
        path = out / f"{name}.html"
        path.write_text(module_html(module, source=rel))
        paths[name] = path
    return paths


def _module(name):
    return parse_module((ROOT / FILES[name]).read_text(), FILES[name])


def _open(browser, path, **kw):
    return browser.open(Path(path).as_uri(), **kw)


# ------------------------------------------------------------------ basics --
@pytest.mark.parametrize("name", sorted(FILES))
def test_page_opens_without_script_errors_or_network(browser, pages, name):
    page = _open(browser, pages[name])
    assert page.evaluate("window.__pageErrors") == []
    assert page.errors == []
    assert page.requests == [pages[name].as_uri()]  # nothing but the file itself
    assert page.evaluate("document.querySelectorAll('svg.graph .node').length") > 0


def test_summary_numbers_are_the_stats(browser, pages):
    page = _open(browser, pages["all_collectives"])
    stats = module_stats(_module("all_collectives"))
    stat = lambda key: int(page.evaluate(f"document.querySelector('[data-stat={key}]').dataset.value"))  # noqa: E731
    assert stat("instructions") == stats.instructions
    assert stat("flops") == stats.flops
    assert stat("collectives") == sum(stats.collective_count.values())
    kinds = page.evaluate("[...document.querySelectorAll('#collective-kinds tr[data-kind]')]"
                          ".map(r => [r.dataset.kind, +r.dataset.count, +r.dataset.bytes])")
    assert {k: (n, b) for k, n, b in kinds} == {k: (stats.collective_count[k], stats.collective_bytes[k])
                                                for k in stats.collective_count}
    assert len(kinds) == 5  # all-gather, all-reduce, all-to-all, collective-permute, reduce-scatter
    opcodes = page.evaluate("Object.fromEntries([...document.querySelectorAll('tr[data-opcode]')]"
                            ".map(r => [r.dataset.opcode, +r.dataset.count]))")
    assert opcodes == dict(stats.opcodes)


# ---------------------------------------------------------- collectives --
@pytest.mark.parametrize("name", ["all_collectives", "collectives_2d", "dp_mlp_step"])
def test_every_collective_is_listed_and_each_one_is_found_in_the_graph(browser, pages, name):
    module = _module(name)
    expected = sorted(i.name for i in module.all_instructions() if collective_kind(i) is not None)
    page = _open(browser, pages[name])
    listed = page.evaluate("[...document.querySelectorAll('.coll-row')].map(r => r.dataset.instr)")
    assert sorted(listed) == expected and expected
    for k, instr in enumerate(listed):
        page.evaluate(f"document.querySelectorAll('.coll-row')[{k}].closest('details').open = true")
        page.click(".coll-row", index=k)
        assert page.evaluate("document.getElementById('selected-name').textContent") == instr
        # The graph opened the groups around it and shows it selected, in the visible part.
        seen = page.evaluate(
            "(() => { const n = document.querySelector('svg.graph .node.selected');"
            " if (!n) return null; const r = n.getBoundingClientRect(), s = document.getElementById('graph')"
            ".getBoundingClientRect(); return [n.dataset.name, r.left >= s.left - 1 && r.right <= s.right + 1"
            " && r.top >= s.top - 1 && r.bottom <= s.bottom + 1]; })()")
        assert seen == [instr, True]
    assert page.errors == []


def test_the_all_reduce_and_its_source_line_in_two_clicks(browser, pages):
    """XLA's partition of a Megatron MLP: the row-parallel matmul's annotation costs an all-reduce.
    From the opened page: click its source line in the collectives panel, click the all-reduce."""
    module = _module("megatron_spmd")
    ar = next(i for i in module.all_instructions() if i.opcode.value == "all-reduce")
    frame = module.tables.source_location(ar.metadata.stack_frame_id)
    page = _open(browser, pages["megatron_spmd"])
    page.click(".coll-line summary")                                  # 1
    page.click(".coll-line[open] .coll-row")                          # 2
    assert page.evaluate("document.getElementById('selected-name').textContent") == ar.name
    src = page.evaluate("[document.getElementById('source-line').dataset.file,"
                        " +document.getElementById('source-line').dataset.line]")
    assert src == [frame[0], frame[1]]
    assert page.evaluate("document.querySelectorAll('#stack li').length") >= 2  # the Python stack
    # Its replica groups, drawn on the mesh: [4,2]<=[8] is {0,1},{2,3},{4,5},{6,7}.
    fills = page.evaluate("[...document.querySelectorAll('.groups-picture .device')]"
                          ".map(g => g.querySelector('rect').getAttribute('fill'))")
    assert len(fills) == 8
    assert [fills[d] == fills[d ^ 1] for d in range(8)] == [True] * 8
    assert len({fills[0], fills[2], fills[4], fills[6]}) == 4


def test_collective_permute_pairs_are_drawn_as_arrows(browser, pages):
    module = _module("all_collectives")
    cp = next(i for i in module.all_instructions() if i.opcode.value == "collective-permute")
    pairs = cp.attr("source_target_pairs")
    page = _open(browser, pages["all_collectives"])
    page.type_text("#search", cp.name)
    assert page.evaluate("document.getElementById('selected-name').textContent") == cp.name
    assert page.evaluate("document.querySelectorAll('.groups-picture path.pair').length") == len(pairs)


# -------------------------------------------------------------- shardings --
def test_sharding_picture_of_a_partially_replicated_parameter(browser, pages):
    """x.1 has {devices=[4,1,2]<=[8] last_tile_dim_replicate}: 4 row tiles, each on 2 devices."""
    module = _module("megatron_mlp")
    x = next(p for p in module.entry.parameters if p.name == "x.1")
    assert x.sharding.to_hlo() == "{devices=[4,1,2]<=[8] last_tile_dim_replicate}"
    page = _open(browser, pages["megatron_mlp"])
    page.click('svg.graph .node[data-name="x.1"]')
    tiles = page.evaluate("[...document.querySelectorAll('.sharding-picture .tile')].map(t => t.dataset.devices)")
    assert tiles == ["0,1", "2,3", "4,5", "6,7"]
    assert page.evaluate("[+document.querySelector('.sharding-picture svg.tiles').dataset.rows,"
                         " +document.querySelector('.sharding-picture svg.tiles').dataset.cols]") == [4, 1]
    fills = page.evaluate("[...document.querySelectorAll('.sharding-picture svg.mesh .device')]"
                          ".map(g => g.querySelector('rect').getAttribute('fill'))")
    assert len(fills) == 8 and fills[0] == fills[1] and len(set(fills)) == 4
    assert page.evaluate("document.getElementById('tile-shape').textContent") == "f32[4,32]"
    assert "partial replication" in page.evaluate("document.querySelector('.sharding-picture').textContent")


def test_manual_sharding_is_drawn_hatched(browser, pages):
    module = _module("collectives_2d")
    manual = next(i for i in module.all_instructions()
                  if i.sharding is not None and i.sharding.to_hlo() == "{manual}")
    page = _open(browser, pages["collectives_2d"])
    page.type_text("#search", f"{manual.parent.name}/{manual.name}")
    assert page.evaluate("document.getElementById('selected-name').textContent") == manual.name
    assert page.evaluate("document.querySelector('.sharding-picture').dataset.shardingKind") == "manual"
    assert page.evaluate("document.querySelectorAll('.sharding-picture rect[fill=\"url(#hatch)\"]').length") == 8


# ----------------------------------------------------------------- graph --
def test_a_group_opens_in_place_and_closes(browser, pages):
    page = _open(browser, pages["scan_while"])
    before = page.evaluate("+document.querySelector('svg.graph').dataset.nodes")
    groups = page.evaluate("[...document.querySelectorAll('svg.graph .node.group')].map(g => g.dataset.key)")
    assert groups
    page.click(f'svg.graph .node.group[data-key="{groups[0]}"]')
    assert page.evaluate(f"!!document.querySelector('svg.graph .cluster[data-key=\"{groups[0]}\"]')")
    assert page.evaluate("+document.querySelector('svg.graph').dataset.nodes") > before
    page.click(f'svg.graph .cluster[data-key="{groups[0]}"] text')
    assert page.evaluate("+document.querySelector('svg.graph').dataset.nodes") == before


def test_a_while_body_opens_in_place(browser, pages):
    module = _module("scan_while")
    page = _open(browser, pages["scan_while"])
    # The entry calls while.22_computation; open it, then the while's body and condition in place.
    page.type_text("#search", "while.6")
    page.click("#details .chips button")
    clusters = page.evaluate("[...document.querySelectorAll('svg.graph .cluster.body')].map(c => c.dataset.key)")
    assert len(clusters) == 3  # the body around both callees, and one per callee
    names = set(page.evaluate("[...document.querySelectorAll('svg.graph .node[data-name]')].map(n => n.dataset.name)"))
    body = module.computation("region_0.3")
    assert body.root.name in names
    assert page.errors == []


# ---------------------------------------------------------- report, diff --
def test_pass_report(browser, tmp_path):
    src = str(ROOT / FILES["dp_mlp_step"])
    out, report = tmp_path / "fused.hlo", tmp_path / "report.html"
    assert cli(["run", src, "--passes=collective-fusion{combine-threshold-in-bytes=16384},dce", "--report", str(report),
                "-o", str(out)]) == 0
    before, after = module_stats(_module("dp_mlp_step")), module_stats(parse_module(out.read_text()))
    page = _open(browser, report)
    rows = page.evaluate("[...document.querySelectorAll('#passes tr[data-pass]')].map(r => [r.dataset.pass, r.dataset.changed])")
    assert rows == [["collective-fusion{combine-threshold-in-bytes=16384}", "yes"], ["dce", "yes"]]
    # Before/after charts of the first pass carry the stats' numbers.
    bar = lambda sec, chart, series: page.evaluate(  # noqa: E731
        f"+document.querySelector('#pass-{sec} [data-chart={chart}] rect[data-series={series}][data-category=\"all-reduce\"]').dataset.value")
    assert bar(0, "collective-count", "before") == before.collective_count["all-reduce"] == 6
    assert bar(0, "collective-count", "after") == after.collective_count["all-reduce"] == 3
    assert bar(0, "collective-bytes", "after") == after.collective_bytes["all-reduce"]
    remark = page.evaluate("[...document.querySelectorAll('#pass-0 .remark')].map(r => r.textContent)")
    assert any("combined 3 all-reduces" in r and "make_dp_mlp_step.py:31" in r for r in remark)
    assert page.evaluate("document.querySelector('#pass-0 [data-diff]').dataset.diff") == "different"
    # The remark's instruction is a link into the final module's view.
    page.click("#pass-0 .remark a")
    assert page.evaluate("document.getElementById('final-view').style.display") == ""
    name = page.evaluate("document.getElementById('selected-name').textContent")
    assert name.startswith("all-reduce")
    assert int(page.evaluate("document.querySelector('#final-view [data-stat=instructions]').dataset.value")) == \
        after.instructions
    # psum.36 was merged away: its link says so instead of showing a namesake (psum.360 ...).
    page.evaluate("window.__page.openInView('xla.sdy.inlinable_manual_computation_body.13_spmd', 'psum.36')")
    assert "not in the final module" in page.evaluate("document.getElementById('not-in-final').textContent")
    assert page.errors == []


def test_diff_page(browser, tmp_path):
    a, b = _module("megatron_mlp"), _module("megatron_mlp")
    PassManager(parse_pipeline("spmd-partition{num-partitions=8}").passes).run(b)
    path = tmp_path / "diff.html"
    path.write_text(diff_html(a, b, "before.hlo", "after.hlo"))
    diff = diff_modules(a, b)
    page = _open(browser, path)
    counts = page.evaluate("(() => { const d = document.getElementById('diff-counts').dataset;"
                           " return [+d.removed, +d.added, +d.changed]; })()")
    expected = [sum(ch.kind == k for c in diff.computations for ch in c.changes) for k in ("removed", "added", "changed")]
    assert counts == expected and sum(expected) > 0
    rows = page.evaluate("document.querySelectorAll('table.diff tr[data-change]').length")
    assert rows == sum(expected)
    # A computation only B has (the all-reduce's adder) is shown whole, on B's side.
    assert diff.computations_added
    added = sum(len(b.computation(n).instructions) for n in diff.computations_added)
    assert page.evaluate("document.querySelectorAll('table.diff tr[data-whole=added] td.b').length") == added
    flops = page.evaluate("[+document.querySelector('tr[data-metric=FLOPs]').dataset.a,"
                          " +document.querySelector('tr[data-metric=FLOPs]').dataset.b]")
    assert flops == [module_stats(a).flops, module_stats(b).flops]
    assert page.errors == []
