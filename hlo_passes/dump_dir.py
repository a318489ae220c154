"""XLA dump directories (`XLA_FLAGS=--xla_dump_to=DIR`) as inputs.

XLA names every file after the module's process-wide number and name, then the stage:

    module_0014.jit_step.before_optimizations.txt          the module as JAX handed it to XLA
    module_0014.jit_step.0004.spmd-partitioner.after_sharding-propagation.before_spmd-partitioning.txt
                                                           a pass dump (--xla_dump_hlo_pass_re=...):
                                                           sequence number, pipeline, the pass just
                                                           run, the pass about to run
    module_0014.jit_step.cpu_after_optimizations.txt       after XLA's whole pipeline (fused, scheduled;
                                                           on a GPU the prefix names the chip:
                                                           sm_9.0a_gpu_after_optimizations)
    ... .hlo.pb                                            the same as a binary proto
                                                           (--xla_dump_hlo_as_proto)

plus files this module ignores (buffer assignments, memory reports, object files, the
`module_0014.jit_step/` folder of compile options).

    dump = DumpDirectory(Path("DIR"))
    dump.modules()                              # [DumpModule(number=14, name="jit_step", stages=[...])]
    stage = dump.find("jit_step", "after_spmd-partitioning")
    text = stage.read_text()                    # protos are printed by XLA's own printer

A stage is selected by (in this order): `before_optimizations`, `after_optimizations`
(whatever the platform prefix), a pass dump's sequence number (`0004`), `after_P` or
`before_P`, or a bare pass name `P` (= `after_P`).  A module by its name or its number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

_FILE = re.compile(r"^module_(?P<number>\d+)\.(?P<name>[^.]+(?:\.[^.]+)*?)\.(?P<stage>"
                   r"before_optimizations|(?:[a-z0-9][\w.]*?_)?after_optimizations|"
                   r"(?P<seq>\d{4})\.(?P<pipeline>[^.]+)\.after_(?P<after>[^.]+)\.before_(?P<before>[^.]+))"
                   r"(?P<ext>\.txt|\.hlo\.pb)$")


class DumpError(ValueError):
    """The directory, module or stage asked for is not there (the message lists what is)."""


@dataclass(frozen=True)
class DumpStage:
    """One dumped module file (its text form and/or its proto form)."""

    module_number: int
    module_name: str
    stage: str           # before_optimizations | after_optimizations | NNNN.PIPELINE.after_P.before_Q
    files: tuple[Path, ...]   # .txt first when both exist
    sequence: int | None = None
    after_pass: str | None = None
    before_pass: str | None = None

    @property
    def path(self) -> Path:
        return self.files[0]

    @property
    def label(self) -> str:
        """How listings and messages name the stage."""
        if self.sequence is None:
            return self.stage
        return f"{self.sequence:04d} after_{self.after_pass}"

    def read_text(self) -> str:
        """The module's HLO text; a proto-only dump is printed by XLA's printer (through jaxlib)."""
        text_file = next((f for f in self.files if f.suffix == ".txt"), None)
        if text_file is not None:
            return text_file.read_text()
        return proto_file_text(self.files[0])

    def size(self) -> int:
        return self.path.stat().st_size


@dataclass
class DumpModule:
    number: int
    name: str
    stages: list[DumpStage] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"module_{self.number:04d}.{self.name}"


class DumpDirectory:
    """The modules and stages XLA wrote under one `--xla_dump_to` directory."""

    def __init__(self, path: Path):
        self.path = Path(path)
        if not self.path.is_dir():
            raise DumpError(f"{path}: not a directory")
        by_key: dict[tuple[int, str, str], list[Path]] = {}
        meta: dict[tuple[int, str, str], re.Match] = {}
        for f in sorted(self.path.iterdir()):
            m = _FILE.match(f.name)
            if m is None or not f.is_file():
                continue
            stage = m["stage"]
            if stage.endswith("after_optimizations"):
                stage = "after_optimizations"
            key = (int(m["number"]), m["name"], stage)
            by_key.setdefault(key, []).append(f)
            meta[key] = m
        modules: dict[tuple[int, str], DumpModule] = {}
        for key in sorted(by_key):
            number, name, stage = key
            m = meta[key]
            files = tuple(sorted(by_key[key], key=lambda f: f.suffix != ".txt"))
            seq = int(m["seq"]) if m["seq"] else None
            module = modules.setdefault((number, name), DumpModule(number, name))
            module.stages.append(DumpStage(number, name, stage, files, seq, m["after"], m["before"]))
        for module in modules.values():
            module.stages.sort(key=_stage_order)
        self._modules = sorted(modules.values(), key=lambda m: m.number)

    def modules(self) -> list[DumpModule]:
        return list(self._modules)

    def module(self, selector: str | None) -> DumpModule:
        """The module named or numbered `selector` (None: the only one, else the newest program
        that is not one of JAX's small helper modules is not guessed: an error lists them)."""
        if not self._modules:
            raise DumpError(f"{self.path}: no module_*.txt or .hlo.pb files (is it an XLA dump directory?)")
        if selector is None:
            if len(self._modules) == 1:
                return self._modules[0]
            raise DumpError(f"{self.path} holds {len(self._modules)} modules; pick one with --module "
                            f"({_names(self._modules)})")
        wanted = selector.removeprefix("module_")
        found = [m for m in self._modules
                 if wanted in (m.name, m.label.removeprefix("module_"))
                 or (wanted.isdigit() and int(wanted) == m.number)]
        if not found:
            raise DumpError(f"{self.path}: no module named or numbered {selector!r} ({_names(self._modules)})")
        if len(found) > 1:
            numbers = ", ".join(f"{m.number:04d}" for m in found)
            raise DumpError(f"{self.path}: {len(found)} modules are named {selector!r} (numbers {numbers}); "
                            "pick one by number")
        return found[0]

    def find(self, module: str | None, stage: str | None = None) -> DumpStage:
        """One stage of one module (default: before_optimizations)."""
        return select_stage(self.module(module), stage or "before_optimizations")


def _stage_order(s: DumpStage) -> tuple:
    if s.stage == "before_optimizations":
        return (0, 0)
    if s.stage == "after_optimizations":
        return (2, 0)
    return (1, s.sequence)


def _names(modules: list[DumpModule], limit: int = 12) -> str:
    shown = ", ".join(f"{m.number:04d} {m.name}" for m in modules[:limit])
    return shown + (f", ... {len(modules) - limit} more" if len(modules) > limit else "")


def select_stage(module: DumpModule, selector: str) -> DumpStage:
    """See the module docstring for what a stage selector may say."""
    s = selector.strip()
    exact = [st for st in module.stages if st.stage == s]
    if exact:
        return exact[0]
    if s.endswith("after_optimizations"):
        found = [st for st in module.stages if st.stage == "after_optimizations"]
    elif s.isdigit():
        found = [st for st in module.stages if st.sequence == int(s)]
    elif s.startswith("before_"):
        found = [st for st in module.stages if st.before_pass == s.removeprefix("before_")]
    else:
        found = [st for st in module.stages if st.after_pass == s.removeprefix("after_")]
    if len(found) == 1:
        return found[0]
    have = ", ".join(st.label for st in module.stages)
    if not found:
        raise DumpError(f"{module.label}: no stage {selector!r} (it has: {have})")
    numbers = ", ".join(f"{st.sequence:04d}" for st in found)
    raise DumpError(f"{module.label}: {len(found)} stages match {selector!r} (dumps {numbers}); pick one by number")


def proto_file_text(path: Path) -> str:
    """HLO text of a `.hlo.pb` file: an HloModuleProto, or XLA's dump wrapper around one
    (HloProto, whose field 1 is the module; HloSnapshot, whose field 1 is an HloProto).

    XLA's printer does it, in a separate process: the first call into XLA's C++ freezes
    XLA_FLAGS, and the device count a verification needs is only known once the module is
    read."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", "import sys; from hlo_passes.dump_dir import _print_proto; "
                           "sys.exit(_print_proto(sys.argv[1]))", str(path)],
                          capture_output=True, text=True, env=_quiet_env())
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["unreadable"])[-1]
        raise DumpError(f"{path}: not a serialized HLO module ({why})")
    return done.stdout


def _quiet_env() -> dict[str, str]:
    import os

    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3"),
            "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}


def _print_proto(path: str) -> int:
    """Child-process side of `proto_file_text`."""
    import sys

    from hlo_passes.runtime.xla_backend import proto_to_text  # deferred: numpy, and jax to decode

    data = Path(path).read_bytes()
    for _ in range(2):  # HloSnapshot -> HloProto -> HloModuleProto
        first = _length_delimited_field(data, 1)
        if first is None or _is_name(first):  # an HloModuleProto starts with its name
            break
        data = first
    try:
        sys.stdout.write(proto_to_text(data))
    except Exception as e:  # XLA's deserialization error
        print(str(e).splitlines()[0] if str(e) else type(e).__name__, file=sys.stderr)
        return 1
    return 0


def _is_name(field: bytes) -> bool:
    """Does a length-delimited field read as a module name (printable UTF-8), not a nested message?"""
    try:
        text = field.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return text.isprintable()


def _length_delimited_field(data: bytes, number: int) -> bytes | None:
    """The first length-delimited field `number` of a protobuf message (wire format), or None."""
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        if key is None:
            return None
        field_number, wire = key >> 3, key & 7
        if wire == 0:
            _, i = _varint(data, i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == 2:
            length, i = _varint(data, i)
            if length is None or i + length > len(data):
                return None
            if field_number == number:
                return data[i:i + length]
            i += length
        else:
            return None
        if i is None:
            return None
    return None


def _varint(data: bytes, i: int) -> tuple[int | None, int | None]:
    value, shift = 0, 0
    while i < len(data) and shift < 64:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7
    return None, None


__all__ = ["DumpDirectory", "DumpError", "DumpModule", "DumpStage", "proto_file_text", "select_stage"]
