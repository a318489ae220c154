"""Values partitioned as unread stand-ins must never be read (issue 11; a wrong program the
Shardy probe found, 2026-11-27).

A slice whose only user is a concatenate that rotates the slices' operand (`_rotate` reads
the operand itself), and a pad whose only user is a slice merged with it into one pad, are
partitioned as zeros that nobody reads.  The recompute step (recompute.py), asked for the
concatenate (or the merged slice) whole by a second user, rebuilt it from those zeros: the
stacked output of a scan that rotates its carry came back as zeros.  Stand-ins are now marked
(`PValue.stand_in`): recompute does not take them as held whole, and a reshard of one is an
internal error rather than a wrong value."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.spmd.partitioning import collectives, partition_verified

ROTATION_READ_TWICE = """HloModule rotation_read_twice, num_partitions=8

ENTRY main {
  c = f32[16,4] parameter(0), sharding={devices=[8,1]<=[8]}
  ys = f32[5,4] parameter(1), sharding={replicated}
  i = s32[] parameter(2), sharding={replicated}
  a = f32[15,4] slice(c), slice={[1:16], [0:4]}
  b = f32[1,4] slice(c), slice={[0:1], [0:4]}
  cc = f32[16,4] concatenate(a, b), dimensions={0}, sharding={devices=[8,1]<=[8]}
  r = f32[1,4] slice(cc), slice={[0:1], [0:4]}
  zero = s32[] constant(0)
  ys2 = f32[5,4] dynamic-update-slice(ys, r, i, zero), sharding={replicated}
  ROOT t = (f32[16,4], f32[5,4]) tuple(cc, ys2), sharding={{devices=[8,1]<=[8]}, {replicated}}
}
"""

MERGED_PAD_READ_TWICE = """HloModule merged_pad_read_twice, num_partitions=8

ENTRY main {
  c = f32[16,4] parameter(0), sharding={devices=[8,1]<=[8]}
  ys = f32[5,4] parameter(1), sharding={replicated}
  i = s32[] parameter(2), sharding={replicated}
  z = f32[] constant(0)
  p = f32[18,4] pad(c, z), padding=1_1x0_0
  s = f32[16,4] slice(p), slice={[2:18], [0:4]}, sharding={devices=[8,1]<=[8]}
  r = f32[1,4] slice(s), slice={[0:1], [0:4]}
  zero = s32[] constant(0)
  ys2 = f32[5,4] dynamic-update-slice(ys, r, i, zero), sharding={replicated}
  ROOT t = (f32[16,4], f32[5,4]) tuple(s, ys2), sharding={{devices=[8,1]<=[8]}, {replicated}}
}
"""

SCAN_ROTATING_ITS_CARRY = """HloModule scan_rotating_carry, num_partitions=8

body {
  p = (s32[], f32[16,4], f32[5,4]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  c = f32[16,4] get-tuple-element(p), index=1
  cs = f32[16,4] custom-call(c), custom_call_target="Sharding", sharding={devices=[8,1]<=[8]}
  a = f32[15,4] slice(cs), slice={[1:16], [0:4]}
  b = f32[1,4] slice(cs), slice={[0:1], [0:4]}
  cc = f32[16,4] concatenate(a, b), dimensions={0}
  ys = f32[5,4] get-tuple-element(p), index=2
  r = f32[1,4] slice(cc), slice={[0:1], [0:4]}
  zero = s32[] constant(0)
  ys2 = f32[5,4] dynamic-update-slice(ys, r, i, zero)
  ROOT t = (s32[], f32[16,4], f32[5,4]) tuple(i1, cc, ys2)
}

cond {
  p = (s32[], f32[16,4], f32[5,4]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(5)
  ROOT lt = pred[] compare(i, n), direction=LT
}

ENTRY main {
  zero = s32[] constant(0)
  x = f32[16,4] parameter(0), sharding={devices=[8,1]<=[8]}
  z = f32[] constant(0)
  ys = f32[5,4] broadcast(z), dimensions={}
  init = (s32[], f32[16,4], f32[5,4]) tuple(zero, x, ys)
  w = (s32[], f32[16,4], f32[5,4]) while(init), condition=cond, body=body
  o1 = f32[16,4] get-tuple-element(w), index=1
  o2 = f32[5,4] get-tuple-element(w), index=2
  ROOT t = (f32[16,4], f32[5,4]) tuple(o1, o2), sharding={{devices=[8,1]<=[8]}, {replicated}}
}
"""


def test_a_rotation_read_again_whole_is_gathered_not_rebuilt_from_stand_ins():
    """cc rotates c by one row (one collective-permute); its first row is also wanted whole.
    The whole cc was rebuilt from the slices' stand-ins (zeros): output 1 was zeros."""
    module, _ = partition_verified(ROTATION_READ_TWICE)
    assert collectives(module)["collective-permute"] == 1


def test_a_pad_merged_into_its_slice_and_read_again_whole():
    """The slice of a pad is partitioned as one shifted pad and the pad as a stand-in; the
    slice's value wanted whole was rebuilt from that stand-in."""
    partition_verified(MERGED_PAD_READ_TWICE)


def test_a_scan_that_rotates_its_carry_writes_its_stacked_rows():
    """The probe's JAX scan (`c2 = concat([c[1:], c[:1]])`, writing `c2[0]` into its stacked
    output each step): every stacked row came back as zeros."""
    partition_verified(SCAN_ROTATING_ITS_CARRY)


TILINGS = ("{devices=[8,1]<=[8]}", "{devices=[4,2]<=[8]}", "{devices=[2,1,4]<=[8] last_tile_dim_replicate}",
           "{devices=[4,1,2]<=[8] last_tile_dim_replicate}")
SECOND_USERS = (
    "  u = f32[1,{c}] slice(v), slice={{[0:1], [0:{c}]}}, sharding={{replicated}}",
    "  z2 = f32[] constant(0)\n  u = f32[{c}] reduce(v, z2), dimensions={{0}}, to_apply=add, sharding={{replicated}}",
    "  u = f32[{r},{c}] negate(v), sharding={{replicated}}",
    "  u = f32[{c},{r}] transpose(v), dimensions={{1,0}}, sharding={{devices=[8,1]<=[8]}}",
)


def _read_twice(seed: int) -> str:
    """A rotation (or a pad merged into its slice) of a tiled value, read by the root as it is
    and by a second user that wants it otherwise: replicated whole, reduced, transposed."""
    import random

    rng = random.Random(seed)
    rows, cols = rng.choice(((16, 4), (24, 8), (32, 6)))
    k = rng.randrange(1, rows)
    tiling = rng.choice(TILINGS)
    if rng.random() < 0.5:
        made = (f"  a = f32[{k},{cols}] slice(x), slice={{[{rows - k}:{rows}], [0:{cols}]}}\n"
                f"  b = f32[{rows - k},{cols}] slice(x), slice={{[0:{rows - k}], [0:{cols}]}}\n"
                f"  v = f32[{rows},{cols}] concatenate(a, b), dimensions={{0}}, sharding={tiling}")
    else:
        lo = rng.randrange(0, 3)
        made = (f"  zp = f32[] constant(0)\n"
                f"  pd = f32[{rows + lo + 2},{cols}] pad(x, zp), padding={lo}_2x0_0\n"
                f"  v = f32[{rows},{cols}] slice(pd), slice={{[{lo + 1}:{lo + 1 + rows}], [0:{cols}]}}, "
                f"sharding={tiling}")
    second = rng.choice(SECOND_USERS).format(r=rows, c=cols)
    return f"""HloModule read_twice_{seed}, num_partitions=8

add {{
  p = f32[] parameter(0)
  q = f32[] parameter(1)
  ROOT s = f32[] add(p, q)
}}

ENTRY main {{
  x = f32[{rows},{cols}] parameter(0), sharding={tiling}
{made}
{second}
  ROOT t = (f32[{rows},{cols}], {second.split('=')[1].split()[0] if 'reduce' not in second else f'f32[{cols}]'}) tuple(v, u)
}}
"""


@pytest.mark.parametrize("seed", range(12))
def test_random_rotations_and_merged_pads_read_twice(seed):
    partition_verified(_read_twice(seed))


FUZZ_CASES = sorted((Path(__file__).parent / "stand_in_cases").glob("*.hlo"))


@pytest.mark.parametrize("path", FUZZ_CASES, ids=lambda p: p.stem)
def test_fuzz_found_rolls_read_twice(path):
    """What `fuzz_spmd.py --families roll,slice,reduce,dynamic-update-slice --sparse` found once
    rolls were in the generator: seed 41016 a wrong program on the code before the stand-in
    fix, seed 41057 a crash of its first version (a recomputed stand-in asked for again)."""
    partition_verified(path.read_text())
