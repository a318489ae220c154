"""Heavy dependencies imported on first use, so that commands which never touch them start fast.

`hlo-passes fmt` reads and prints text; it never builds an array, yet the IR's sharding
module uses numpy in its methods.  `from hlo_passes._deferred import numpy as np` gives
such a module a stand-in that imports numpy the first time an attribute is read
(`np.asarray`), and behaves as numpy from then on.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class Deferred:
    """A module imported on first attribute access."""

    __slots__ = ("_name", "_module")

    def __init__(self, name: str):
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        module = self._module
        if module is None:
            module = self._module = importlib.import_module(self._name)
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<deferred module {self._name!r}>"


numpy = Deferred("numpy")
