"""A gather's or scatter's index dimension numbers are checked as XLA's shape inference checks
them (its verifier): an out-of-range batching dim crashed sharding propagation (a probe
finding).  Each broken module is one change to a valid one; the valid ones XLA compiles."""

from __future__ import annotations

import pytest

from hlo_passes import parse_module
from hlo_passes.parse.errors import HloParseError

SCATTER = """HloModule s

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  base = f32[8,32,4] parameter(0)
  idx = s32[8,5,1] parameter(1)
  upd = f32[8,5,4] parameter(2)
  ROOT s = f32[8,32,4] scatter(base, idx, upd), update_window_dims={2}, inserted_window_dims={1}, scatter_dims_to_operand_dims={1}, input_batching_dims={0}, scatter_indices_batching_dims={0}, index_vector_dim=2, to_apply=add
}
"""

GATHER = """HloModule g

ENTRY main {
  x = f32[8,32,4] parameter(0)
  idx = s32[8,5,1] parameter(1)
  ROOT g = f32[8,5,4] gather(x, idx), offset_dims={2}, collapsed_slice_dims={1}, start_index_map={1}, operand_batching_dims={0}, start_indices_batching_dims={0}, index_vector_dim=2, slice_sizes={1,1,4}
}
"""


def test_the_valid_forms_parse():
    parse_module(SCATTER)
    parse_module(GATHER)


@pytest.mark.parametrize("text, change, message", [
    (SCATTER, ("scatter_indices_batching_dims={0}", "scatter_indices_batching_dims={7}"), "out of range for rank 3"),
    (SCATTER, ("scatter_indices_batching_dims={0}", "scatter_indices_batching_dims={2}"), "index vector dimension"),
    (SCATTER, ("scatter_dims_to_operand_dims={1}", "scatter_dims_to_operand_dims={0}"), "names a batching dimension"),
    (SCATTER, ("scatter_dims_to_operand_dims={1}", "scatter_dims_to_operand_dims={1,2}"), "index vector has 1"),
    (SCATTER, ("update_window_dims={2}", "update_window_dims={5}"), "out of range for rank 3"),
    (SCATTER, ("inserted_window_dims={1}", "inserted_window_dims={}"), "name 2 dimensions"),
    (SCATTER, ("index_vector_dim=2", "index_vector_dim=4"), "index_vector_dim=4 is out of range"),
    (GATHER, ("start_indices_batching_dims={0}", "start_indices_batching_dims={9}"), "out of range for rank 3"),
    (GATHER, ("start_index_map={1}", "start_index_map={3}"), "out of range for rank 3"),
    (GATHER, ("start_indices_batching_dims={0}", "start_indices_batching_dims={}"), "has 0 entries"),
], ids=["scatter_batching_range", "scatter_batching_is_ivd", "scatter_map_batching", "scatter_map_size",
        "scatter_window_range", "scatter_window_count", "scatter_ivd", "gather_batching_range",
        "gather_map_range", "gather_batching_count"])
def test_broken_index_dimension_numbers_are_refused(text, change, message):
    with pytest.raises(HloParseError, match=message):
        parse_module(text.replace(*change))
