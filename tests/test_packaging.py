"""The package as `pip install .` puts it, not the editable checkout: the wheel must carry
everything the program loads at run time (the Lark grammars above all), and the installed
`hlo_passes` must work from a directory that is not the checkout."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TINY = """HloModule tiny
ENTRY e {
  p = f32[4] parameter(0)
  ROOT r = f32[4] add(p, p)
}
"""

SHARDY = """HloModule shardy, frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<["x"=2]>}}
ENTRY e {
  p = f32[4] parameter(0), frontend_attributes={xla.sdy.sharding="#sdy.sharding<@mesh, [{\\"x\\"}]>"}
  ROOT r = f32[4] add(p, p)
}
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(out), str(ROOT)], check=True, capture_output=True, text=True)
    (whl,) = out.glob("hlo_passes-*.whl")
    return whl


def test_wheel_ships_the_grammars(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "hlo_passes/grammar/hlo.lark" in names
    assert "hlo_passes/grammar/sdy.lark" in names


def test_installed_wheel_parses_and_prints_outside_the_checkout(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                    str(wheel)], check=True, capture_output=True, text=True)
    work = tmp_path / "work"
    work.mkdir()
    (work / "tiny.hlo").write_text(TINY)
    (work / "shardy.hlo").write_text(SHARDY)
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run([sys.executable, "-c", "import hlo_passes; print(hlo_passes.__file__)"],
                           cwd=work, env=env, capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(site)), f"the checkout, not the wheel, was imported: {where}"
    for name in ("tiny.hlo", "shardy.hlo"):
        run = subprocess.run([sys.executable, "-m", "hlo_passes", "fmt", name], cwd=work, env=env,
                             capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        assert "ROOT r = f32[4] add(p, p)" in run.stdout
    # The Shardy grammar is loaded only when a pass reads Shardy attributes.
    run = subprocess.run([sys.executable, "-c",
                          "from hlo_passes.parse import sdy; print(sdy.GRAMMAR_PATH.read_text()[:1])"],
                         cwd=work, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_wheel_ships_the_view_pages_assets(wheel, tmp_path):
    """`hlo-passes view` inlines its scripts, styles and the vendored dagre from package data."""
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("view/assets/app.js", "view/assets/graph.js", "view/assets/app.css", "view/vendor/dagre.min.js",
                 "view/vendor/dagre.LICENSE"):
        assert f"hlo_passes/{name}" in names
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                    str(wheel)], check=True, capture_output=True, text=True)
    (tmp_path / "tiny.hlo").write_text(TINY)
    run = subprocess.run([sys.executable, "-m", "hlo_passes", "view", "tiny.hlo", "-o", "tiny.html"], cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    html = (tmp_path / "tiny.html").read_text()
    assert "dagre" in html and "mountModuleView" in html
