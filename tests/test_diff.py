"""hlo-passes diff: structural, blind to renumbering; exit 0 equal, 1 different, 2 bad input."""

import subprocess
import sys
from pathlib import Path

from hlo_passes import parse_module, print_module
from hlo_passes.diff import diff_modules
from hlo_passes.passes.manager import PassManager

ROOT = Path(__file__).resolve().parents[1]

A = """HloModule m
add { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }
ENTRY e {
  p = f32[4] parameter(0)
  q = f32[4] parameter(1)
  add.1 = f32[4] add(p, q)
  add.2 = f32[4] multiply(add.1, p)
  z = f32[] constant(0)
  r = f32[] reduce(add.2, z), dimensions={0}, to_apply=add
  c = pred[4] compare(p, q), direction=LT
  ROOT t = (f32[], pred[4]) tuple(r, c)
}
"""

# A with every instruction and computation renumbered, and listed in another order.
A_RENUMBERED = """HloModule m
add.9 { x = f32[] parameter(0)  y = f32[] parameter(1)  ROOT s.3 = f32[] add(x, y) }
ENTRY e {
  q = f32[4] parameter(1)
  p = f32[4] parameter(0)
  c.4 = pred[4] compare(p, q), direction=LT
  add.7 = f32[4] add(p, q)
  add.1 = f32[4] multiply(add.7, p)
  zero = f32[] constant(0)
  r.2 = f32[] reduce(add.1, zero), dimensions={0}, to_apply=add.9
  ROOT t = (f32[], pred[4]) tuple(r.2, c.4)
}
"""


def diff(a: str, b: str):
    return diff_modules(parse_module(a), parse_module(b))


def test_renumbering_is_no_difference():
    d = diff(A, A_RENUMBERED)
    assert d.equal, d.format()
    assert d.format() == ""


def test_changes_are_named():
    b = A.replace("direction=LT", "direction=GT").replace("multiply(add.1, p)", "subtract(add.1, p)")
    d = diff(A, b)
    text = d.format()
    assert "~ c: attributes direction" in text
    assert "~ add.2: opcode multiply -> subtract" in text
    assert "- c = pred[4] compare(p, q), direction=LT" in text and "+ c = pred[4] compare(p, q), direction=GT" in text
    assert not d.computations_added and not d.computations_removed


def test_added_removed_and_computations():
    b = A.replace("  c = pred[4] compare(p, q), direction=LT\n", "")
    b = b.replace("  ROOT t = (f32[], pred[4]) tuple(r, c)",
                  "  s = f32[4] sine(p)\n  ROOT t = (f32[], f32[4]) tuple(r, s)")
    b = b.replace("ENTRY e {", "unused { u = f32[] parameter(0)  ROOT n = f32[] negate(u) }\nENTRY e {")
    d = diff(A, b)
    text = d.format()
    assert "+ computation unused" in text
    assert "  + s = f32[4] sine(p)" in text
    assert "  - c = pred[4] compare(p, q), direction=LT" in text
    assert "~ t: shape (f32[], pred[4]) -> (f32[], f32[4]), operands" in text


def test_what_cse_did():
    path = ROOT / "golden" / "cse" / "merge_chain.hlo"
    before = parse_module(path.read_text())
    after = parse_module(path.read_text())
    PassManager.from_pipeline("cse").run(after)
    d = diff_modules(before, after)
    removed = sorted(c.before.split(" = ")[0] for comp in d.computations for c in comp.changes
                     if c.kind == "removed")
    assert removed == ["b2", "c2", "m2", "r2"]
    changed = [c.what for comp in d.computations for c in comp.changes if c.kind == "changed"]
    assert changed == ["t: operands"]
    assert diff_modules(before, parse_module(print_module(before))).equal


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "hlo_passes", "diff", *args], capture_output=True, text=True)


def test_cli_exit_codes(tmp_path):
    a, b, c, bad = (tmp_path / n for n in ("a.hlo", "b.hlo", "c.hlo", "bad.hlo"))
    a.write_text(A)
    b.write_text(A_RENUMBERED)
    c.write_text(A.replace("direction=LT", "direction=GT"))
    bad.write_text(A.replace("add(p, q)", "add(p)"))
    same = run_cli(str(a), str(b))
    assert (same.returncode, same.stdout) == (0, "")
    different = run_cli(str(a), str(c))
    assert different.returncode == 1
    assert different.stdout.startswith(f"--- {a}\n+++ {c}\n@@ computation e @@\n  ~ c: attributes direction")
    broken = run_cli(str(a), str(bad))
    assert broken.returncode == 2 and "expects 2 operands" in broken.stderr
