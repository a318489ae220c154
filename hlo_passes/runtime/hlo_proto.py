"""Serialized HloModuleProto <-> HLO text, through XLA's own parser and printer.

    text = proto_to_text(proto_bytes)   # what XLA prints for the module
    proto = text_to_proto(text)         # XLA's parser; raises on text it rejects

The module's text form has no device assignment and no logical shardings of the
entry's parameters; `parameter_replicated` reads the latter from the proto
(JAX records them as `spmd_parameters_shardings` when it partitions a module).
"""

from __future__ import annotations

from hlo_passes.runtime.xla_backend import canonical_text, proto_to_text, text_to_proto
from hlo_passes.runtime.xla_backend import proto_parameter_replicated as parameter_replicated

__all__ = ["canonical_text", "parameter_replicated", "proto_to_text", "text_to_proto"]
