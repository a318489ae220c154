"""Serialized HloModuleProto <-> HLO text, through XLA's own parser and printer.

    text = proto_to_text(proto_bytes)   # what XLA prints for the module
    proto = text_to_proto(text)         # XLA's parser; raises on text it rejects

The module's text form has no device assignment and no logical shardings of the
entry's parameters; `parameter_replicated` reads the latter from the proto
(JAX records them as `spmd_parameters_shardings` when it partitions a module).
"""

from __future__ import annotations


def _hlo():
    from jax._src.lib import xla_client as xc

    return xc


def proto_to_text(proto: bytes) -> str:
    """XLA's text for a serialized HloModuleProto."""
    return _hlo().hlo.HloModule.from_serialized_hlo_module_proto(proto).to_string()


def text_to_proto(text: str) -> bytes:
    """A serialized HloModuleProto from HLO text; XLA's parser raises on text it rejects."""
    return _hlo().hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto()


def parameter_replicated(proto: bytes) -> list[bool] | None:
    """Per entry parameter: was it replicated over all devices before SPMD partitioning?

    None when the proto records no parameter shardings (a module JAX did not partition).
    """
    xc = _hlo()
    module = xc.hlo.HloModule.from_serialized_hlo_module_proto(proto)
    shardings = module.spmd_parameters_shardings
    if not shardings:
        return None
    return [xc.HloSharding.from_proto(s).is_replicated() for s in shardings]


def canonical_text(text: str) -> str:
    """XLA's own print of `text` (its parser, then its printer; module config kept)."""
    return _hlo().hlo.hlo_module_from_text(text).to_string()
