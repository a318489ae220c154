"""Registry of passes by name.  Pass modules register themselves on import;
`all_passes()` imports every module under `hlo_passes.passes` first, so a new
pass needs no edit anywhere else."""

from __future__ import annotations

import importlib
import pkgutil

import hlo_passes.passes as package
from hlo_passes.passes.pass_base import ModulePass

_REGISTRY: dict[str, type[ModulePass]] = {}
_discovered = False


def register_pass(cls: type[ModulePass]) -> type[ModulePass]:
    if not cls.name or cls.name != cls.name.lower() or "_" in cls.name:
        raise ValueError(f"{cls.__name__}: pass names are kebab-case, got {cls.name!r}")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"two passes named {cls.name!r}: {_REGISTRY[cls.name].__name__} and {cls.__name__}")
    _REGISTRY[cls.name] = cls
    return cls


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(info.name)
    _discovered = True


def all_passes() -> dict[str, type[ModulePass]]:
    _discover()
    return dict(sorted(_REGISTRY.items()))


def lookup(name: str) -> type[ModulePass] | None:
    _discover()
    return _REGISTRY.get(name)
