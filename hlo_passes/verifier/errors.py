"""VerifierError: one problem the structural verifier found, pointing at an instruction."""

from __future__ import annotations

from dataclasses import dataclass

from hlo_passes.ir.source import SourceSpan


@dataclass(frozen=True)
class VerifierError:
    """`instruction` (or `computation` alone) is wrong because of `message`.

    `context` holds the printed lines around the instruction, the offending one
    marked with `>`, so a failure after a pass reads like a compiler diagnostic.
    `span` is where the text defined the instruction (or computation) when it was
    parsed, not made by a pass: the message then starts with `file:line:col:`.
    """

    message: str
    instruction: str = ""
    computation: str = ""
    context: tuple[str, ...] = ()
    span: SourceSpan | None = None

    def format(self) -> str:
        where = f"%{self.instruction}" if self.instruction else ""
        if self.computation:
            where = f"{self.computation}/{where}" if where else self.computation
        head = f"{where}: {self.message}" if where else self.message
        if self.span is not None:
            head = f"{self.span}: {head}"
        return "\n".join((head, *self.context))

    __str__ = format


class VerificationFailed(Exception):
    """Raised by `check_module`: the module is structurally wrong."""

    def __init__(self, errors: list[VerifierError]):
        self.errors = errors
        more = f"\n({len(errors) - 1} more)" if len(errors) > 1 else ""
        super().__init__(errors[0].format() + more)
