"""hlo-passes: XLA HLO text → IR → Python passes → HLO text, verified by running it."""

from hlo_passes.parse.errors import HloParseError
from hlo_passes.parse.module_parser import parse_module
from hlo_passes.printer import print_module

__all__ = ["HloParseError", "parse_module", "print_module"]
__version__ = "0.1.0"
