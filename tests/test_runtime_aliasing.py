"""A JAX dump's input/output aliasing pairs a donated parameter with an output of the same
per-device shape, which can be another global shape (JAX fuzz seed 3506: a [8,1] parameter
tiled 8 ways donated to a replicated [1,1] output).  XLA refuses such aliasing on the global
module it is asked to partition or run whole; the runtime drops the aliasing (buffer reuse
only, never values), so `exec`, `verify` and `run --verify` judge the program JAX ran."""

from __future__ import annotations

from tests.test_cli_verify import cli

DONATED = """HloModule donated, input_output_alias={ {1}: (0, {}, may-alias) }, num_partitions=8

ENTRY main {
  p = f32[8,1] parameter(0), sharding={devices=[8,1]<=[8]}
  q = f32[8,4] parameter(1), sharding={devices=[8,1]<=[8]}
  s = f32[8,4] multiply(q, q)
  r = f32[1,1] slice(p), slice={[3:4], [0:1]}
  ROOT t = (f32[8,4], f32[1,1]) tuple(s, r), sharding={{devices=[8,1]<=[8]}, {replicated}}
}
"""


def test_aliasing_between_different_global_shapes_is_dropped_before_xla_compiles(tmp_path):
    from hlo_passes.runtime.xla_backend import without_aliasing
    assert without_aliasing(DONATED).splitlines()[0] == "HloModule donated, num_partitions=8"
    assert without_aliasing("HloModule m, buffer_donor={ (0, {}) }, num_partitions=2\nENTRY") == \
        "HloModule m, num_partitions=2\nENTRY"
    src = tmp_path / "donated.hlo"
    src.write_text(DONATED)
    p = cli("exec", src)
    assert p.returncode == 0, p.stderr
    assert "output 1: float32[1, 1]" in p.stdout + p.stderr
    p = cli("run", src, "--passes", "spmd-partition", "--verify", "-o", tmp_path / "out.hlo")
    assert p.returncode == 0 and "EQUIVALENT" in p.stdout + p.stderr, p.stdout + p.stderr
