"""The structural HLO verifier.

    errors = verify_module(module)   # [] when the module is well formed
    check_module(module)             # raises VerificationFailed with the first error

Checks the use-def graph (operands in the same computation, users exact both
ways), module-unique names, one root and parameters 0..n-1 per computation,
called computations present in the module, replica groups, operand counts per
opcode like XLA's parser, and shapes through a per-opcode inference table
(`shape_rules.SHAPE_RULES`, `collectives.COLLECTIVE_RULES`), comparing
dimensions and element types and ignoring layouts.  Opcodes without a rule pass,
so every module XLA accepts is accepted here.
"""

from __future__ import annotations

from hlo_passes.ir.module import Module
from hlo_passes.verifier.checks import first_semantic_problem, instruction_problem, verify_module
from hlo_passes.verifier.errors import VerificationFailed, VerifierError


def check_module(module: Module) -> None:
    """Raise VerificationFailed when `module` has any structural problem."""
    errors = verify_module(module)
    if errors:
        raise VerificationFailed(errors)


__all__ = ["VerificationFailed", "VerifierError", "check_module", "first_semantic_problem",
           "instruction_problem", "verify_module"]
