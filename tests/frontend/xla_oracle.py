"""XLA's own parser and printer, the oracle of the front-end tests."""

from jax._src.lib import xla_client as xc


def xla_canonical(text: str) -> str:
    return xc.hlo.hlo_module_from_text(text).to_string()
