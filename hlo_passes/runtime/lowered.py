"""The HLO text of a `jax.jit(...).lower(...)` with the propagation flags JAX compiles it with.

`Lowered.as_text(dialect="hlo")` does not record `allow_spmd_sharding_propagation_to_parameters`
and `..._to_output`, which JAX passes to its compiler (to the output when the jit names no
`out_shardings`).  Their absence means "no" to XLA's propagation and to ours, so the text alone
partitions a step whose results JAX would have left sharded into one that gathers every result
(a Flax step's new weights: 66 all-gathers).  The compiled module's header has the flags; this
copies them onto the lowered text, so benchmarks and tests partition what `jax.jit` partitions.
"""

from __future__ import annotations

import re
from typing import Any

_FLAG = re.compile(r"allow_spmd_sharding_propagation_to_(?:parameters|output)=\{[^}]*\}")


def with_propagation_flags(text: str, compiled_header: str) -> str:
    """`text` with the propagation flags of `compiled_header` (an HloModule line) added to its
    own header line, except those it already states."""
    first, sep, rest = text.partition("\n")
    flags = [f for f in _FLAG.findall(compiled_header) if f.split("=")[0] not in first]
    return ", ".join([first, *flags]) + sep + rest


def lowered_as_compiled(lowered: Any) -> str:
    """A `jax.stages.Lowered`'s HLO text with the flags its compile uses (it compiles once)."""
    header = lowered.compile().as_text().split("\n", 1)[0]
    return with_propagation_flags(lowered.as_text(dialect="hlo"), header)
