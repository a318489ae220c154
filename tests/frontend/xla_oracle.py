"""XLA's own parser and printer, the oracle of the front-end tests."""

from hlo_passes.runtime.xla_backend import canonical_text


def xla_canonical(text: str) -> str:
    """XLA's canonical print of `text` (raises XLA's error when its parser refuses it)."""
    return canonical_text(text)
