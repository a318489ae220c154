"""Numerical verification through JAX's XLA backend (see verify.py)."""

from hlo_passes.runtime.verify import (VerificationError, VerificationReport, execute_module,
                                       verify_equivalent)

__all__ = ["VerificationError", "VerificationReport", "execute_module", "verify_equivalent"]
