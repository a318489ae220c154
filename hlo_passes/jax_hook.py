"""Run hlo-passes pipelines inside `jax.jit` compilation.

JAX ≥ 0.12 lets Python rewrite the HloModule that XLA compiles
(`jax.extend.xla.register_hlo_module_transformation`): during compilation XLA
hands a callback the serialized HloModuleProto and takes back modified bytes, or
None for "unchanged".  `install` registers such a callback that parses the
module, runs one of our pipelines on it and hands the printed result back:

    from hlo_passes import jax_hook

    with jax_hook.installed("weight-update-sharding,collective-fusion", verify=True) as hook:
        params, opt_state, loss = jax.jit(train_step)(params, opt_state, batch)
    print(hook.stats)
    for remark in hook.stats.remarks:
        print(remark.format())

What the callback sees.  At the pre-scheduler stage XLA has already
SPMD-partitioned, fused and laid out the module: the entry is `main.0_spmd`,
shapes are per device, collectives carry channel ids and mesh replica groups,
fusions are kLoop or kCustom (`__ynn_fusion`) with JSON backend configs, and no
parameter carries a logical sharding.  At the post-scheduler stage the module
is also `is_scheduled=true`.  The text form of the proto has no
`num_partitions`; the hook reads the device assignment from the proto and sets
`module.num_partitions` so that passes see it, and marks the ENTRY parameters JAX
replicated (the proto's `spmd_parameters_shardings`) `parameter_replication={true}`, so that
weight-update-sharding knows the weights are the same on every device.  Every small helper jit
(`jit__reduce_sum`, `jit_broadcast_in_dim`, ...) goes through the callback too.

Safety.  No exception ever reaches XLA, and a rewrite is only handed back when
it parses back in XLA's own parser, each changing pass left a module the
structural verifier accepts and (with `verify=True`) the rewritten module
computes what XLA's module computes.  Otherwise XLA compiles its own module and
a `HookFallback` warning names the pass and the reason.  With `verify=True`
each distinct module is checked once: both modules run as per-device programs
on `num_partitions` devices with the same random inputs per device, and every
device's outputs must agree.  What the check cannot see, because verification compiles both
modules from scratch: that copy insertion has already run (buffer identity is part of the
module's meaning: ir/buffers.py; every pass's output is compared with the input's buffer
sharing), and what XLA:CPU cannot compile at this stage (async collectives; after scheduling,
standalone non-fusion ops: `_cpu_rejects`).  Both are checked after every pass instead.

Re-entrancy.  XLA calls the callback on the thread that compiles; verification
compiles modules from inside the callback on that same thread.  A thread-local
flag makes those nested compilations pass through untouched (no recursion, no
lock held across a compile, so no deadlock); compilations on other threads run
the pipeline concurrently, and the statistics are guarded by a lock.

Caches.  JAX keeps compiled executables per function; `install` and
`uninstall` clear those caches (`clear_caches=True`) so that functions jitted
before are compiled again under (or without) the pipeline.  Executables loaded
from JAX's persistent compilation cache never reach the callback, and ones
compiled under the hook are stored there under the same key as XLA's: `install`
warns when that cache is on.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from hlo_passes.ir.buffers import in_place_sharing, new_sharing
from hlo_passes.ir.opcode import Opcode
from hlo_passes.parse.module_parser import parse_module
from hlo_passes.passes.manager import PassFailed, PassManager
from hlo_passes.passes.pass_base import ModulePass, Remark
from hlo_passes.passes.pipeline import parse_pipeline
from hlo_passes.printer import print_module
from hlo_passes.runtime import hlo_proto
from hlo_passes.runtime.per_device import compare_per_device
from hlo_passes.runtime.recompile import as_fresh_program  # verify's preparation, importable here

STAGES = ("pre-scheduler", "post-scheduler")

log = logging.getLogger(__name__)


class HookFallback(UserWarning):
    """Our rewrite was not used; XLA compiled its own module."""


@dataclass(frozen=True)
class ModuleRecord:
    """What the hook did with one module XLA handed over."""

    index: int
    name: str
    changed: bool  # a rewrite was handed back to XLA
    seconds: float
    passes_changed: tuple[str, ...] = ()
    fallback: str = ""  # why XLA's module was kept although a pass changed it
    verified: bool | None = None  # numeric check result; None when not checked


@dataclass
class HookStats:
    modules_seen: int = 0
    modules_changed: int = 0
    fallbacks: int = 0
    seconds: float = 0.0
    remarks: list[Remark] = field(default_factory=list)
    records: list[ModuleRecord] = field(default_factory=list)

    def __str__(self) -> str:
        return (f"{self.modules_seen} modules seen, {self.modules_changed} rewritten, "
                f"{self.fallbacks} fell back to XLA's module, {self.seconds:.2f}s in the hook")


class _Rejected(Exception):
    """A rewrite that must not be handed back; `culprit` names the pass (or the step) at fault."""

    def __init__(self, culprit: str, reason: str):
        super().__init__(f"{culprit}: {reason}")
        self.culprit = culprit
        self.reason = reason


_guard = threading.local()  # .active: our callback runs on this thread; nested compiles pass through
_names_lock = threading.Lock()
_counter = 0


class Installation:
    """One pipeline registered with XLA's compiler; `uninstall()` removes it.

    pipeline: a pipeline string (`weight-update-sharding,collective-fusion{combine-threshold-in-bytes=1048576}`),
        parsed now so that unknown passes or options fail here and not inside XLA.
    stage: "pre-scheduler" (partitioned, fused, laid out) or "post-scheduler" (also scheduled).
    platforms: XLA platforms whose compiler runs the pipeline.
    dump_dir: write `NNNN.<module>.before.hlo` for every module and `.after.hlo` for rewrites
        handed back (`.rejected.hlo` plus `.fallback.txt` for rewrites that were not).
    verify: numerically compare each rewritten module with XLA's once before handing it back.
    name: the name XLA registers the transformation under (unique per installation by default).
    clear_caches: clear JAX's compiled-function caches on install and uninstall.
    """

    def __init__(self, pipeline: str, *, stage: str = "pre-scheduler", platforms: Sequence[str] = ("cpu",),
                 dump_dir: str | Path | None = None, verify: bool = False, name: str | None = None,
                 clear_caches: bool = True):
        global _counter
        if stage not in STAGES:
            raise ValueError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")
        if isinstance(platforms, str):
            platforms = (platforms,)
        _build_passes(pipeline)  # reject unknown passes and options now, not inside XLA
        with _names_lock:
            _counter += 1
            default_name = f"hlo_passes.{_counter}"
        self.pipeline = pipeline
        self.stage = stage
        self.platforms = tuple(platforms)
        self.dump_dir = Path(dump_dir) if dump_dir is not None else None
        self.verify = verify
        self.name = name or default_name
        self.clear_caches = clear_caches
        self.stats = HookStats()
        self._lock = threading.Lock()
        self._verified: dict[str, tuple[bool, str, str]] = {}  # key -> (ok, culprit, reason)
        self._installed = False
        _warn_if_persistent_cache()
        self._register()

    def __repr__(self) -> str:
        state = "installed" if self._installed else "uninstalled"
        return f"<hlo-passes hook {self.name!r} {self.pipeline!r} at {self.stage}, {state}>"

    # ---------------------------------------------------------- lifecycle --
    def _stage_enum(self):
        from jax.extend import xla as jex

        return (jex.PipelineStage.PRE_SCHEDULER if self.stage == "pre-scheduler"
                else jex.PipelineStage.POST_SCHEDULER)

    def _register(self) -> None:
        from jax.extend import xla as jex

        jex.register_hlo_module_transformation(self._callback, name=self.name, stage=self._stage_enum(),
                                               platforms=list(self.platforms))
        self._installed = True
        self._clear_jax_caches()

    def uninstall(self) -> None:
        """Stop rewriting; functions compiled from now on get XLA's own modules."""
        if not self._installed:
            return
        from jax.extend import xla as jex

        jex.clear_hlo_module_transformation(self.name, self._stage_enum(), list(self.platforms))
        self._installed = False
        self._clear_jax_caches()

    def _clear_jax_caches(self) -> None:
        if self.clear_caches:
            import jax

            jax.clear_caches()

    @property
    def installed(self) -> bool:
        return self._installed

    def __enter__(self) -> Installation:
        return self

    def __exit__(self, *exc) -> None:
        self.uninstall()

    # ----------------------------------------------------------- callback --
    def _callback(self, proto: bytes) -> bytes | None:
        """What XLA calls.  Returns new proto bytes or None; never raises."""
        if getattr(_guard, "active", False):
            return None  # a compilation we started ourselves (verification)
        _guard.active = True
        start = time.perf_counter()
        with self._lock:
            self.stats.modules_seen += 1
            index = self.stats.modules_seen
        try:
            return self._transform(proto, index, start)
        except Exception as e:  # noqa: BLE001 - nothing may reach XLA; XLA then compiles its own module
            with self._lock:
                self.stats.fallbacks += 1
            _warn(f"hlo-passes hook ({self.pipeline}): internal error {type(e).__name__}: {e}; "
                  "XLA compiles its own module")
            return None
        finally:
            with self._lock:
                self.stats.seconds += time.perf_counter() - start
            _guard.active = False

    def _transform(self, proto: bytes, index: int, start: float) -> bytes | None:
        original = hlo_proto.proto_to_text(proto)
        devices = _Devices(*device_assignment(proto), hlo_proto.parameter_replicated(proto))
        module = devices.parse(original)
        self._dump(index, module.name, "before.hlo", original)

        remarks: list[Remark] = []
        changed_by: list[str] = []
        rewritten = ""
        try:
            changed_by = _run_checked(self.pipeline, module, remarks,
                                      cpu_stage=self.stage if "cpu" in self.platforms else None)
            if changed_by:
                rewritten = print_module(module)
                try:
                    new_proto = hlo_proto.text_to_proto(rewritten)
                except Exception as e:  # noqa: BLE001 - XLA's parser says why
                    raise _Rejected(changed_by[-1], f"XLA's parser rejects the rewritten module: {e}") from e
                verified = None
                if self.verify:
                    verified = self._check_numerics(original, rewritten, devices)
        except _Rejected as rejected:
            if rewritten:
                self._dump(index, module.name, "rejected.hlo", rewritten)
            self._dump(index, module.name, "fallback.txt", str(rejected) + "\n")
            self._record(ModuleRecord(index, module.name, False, time.perf_counter() - start,
                                      tuple(changed_by), fallback=str(rejected)), remarks)
            _warn(f"hlo-passes hook: pass '{rejected.culprit}' on module {module.name}: {rejected.reason}; "
                  "XLA compiles its own module")
            return None
        if not changed_by:
            self._record(ModuleRecord(index, module.name, False, time.perf_counter() - start), remarks)
            return None
        self._dump(index, module.name, "after.hlo", rewritten)
        self._record(ModuleRecord(index, module.name, True, time.perf_counter() - start,
                                  tuple(changed_by), verified=verified), remarks)
        return new_proto

    def _record(self, record: ModuleRecord, remarks: list[Remark]) -> None:
        with self._lock:
            self.stats.records.append(record)
            self.stats.remarks.extend(remarks)
            if record.changed:
                self.stats.modules_changed += 1
            if record.fallback:
                self.stats.fallbacks += 1

    # ------------------------------------------------------------ numerics --
    def _check_numerics(self, original: str, rewritten: str, devices: _Devices) -> bool:
        """Raise _Rejected when `rewritten` computes something else; cached per original module."""
        key = hashlib.sha256(f"{self.pipeline}\0{original}".encode()).hexdigest()
        with self._lock:
            verdict = self._verified.get(key)
        if verdict is not None:
            if verdict[0]:
                return True
            raise _Rejected(verdict[1], verdict[2] + " (verdict cached from an earlier compile)")
        try:
            report = _compare(original, rewritten, devices.count, devices.replicated)
            known, why = report.ok, f"the rewrite changes what the module computes\n{report.format()}"
        except Exception as e:  # noqa: BLE001 - XLA's verifier or compiler rejects the rewrite
            known, why = False, f"XLA cannot compile the rewritten module: {type(e).__name__}: {e}"
        culprit = "" if known else _first_mismatching_pass(self.pipeline, original, devices)
        with self._lock:
            self._verified[key] = (known, culprit, why)
        if not known:
            raise _Rejected(culprit, why)
        return True

    # --------------------------------------------------------------- dumps --
    def _dump(self, index: int, module_name: str, suffix: str, text: str) -> None:
        if self.dump_dir is None:
            return
        self.dump_dir.mkdir(parents=True, exist_ok=True)
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", module_name)
        (self.dump_dir / f"{index:04d}.{safe}.{suffix}").write_text(text)


def install(pipeline: str, *, stage: str = "pre-scheduler", platforms: Sequence[str] = ("cpu",),
            dump_dir: str | Path | None = None, verify: bool = False, name: str | None = None,
            clear_caches: bool = True) -> Installation:
    """Run `pipeline` on every module XLA compiles for `platforms` from now on (see Installation)."""
    return Installation(pipeline, stage=stage, platforms=platforms, dump_dir=dump_dir, verify=verify,
                        name=name, clear_caches=clear_caches)


@contextlib.contextmanager
def installed(pipeline: str, **kwargs) -> Iterator[Installation]:
    """`install` for the duration of a `with` block; uninstalls on exit, also on error."""
    inst = install(pipeline, **kwargs)
    try:
        yield inst
    finally:
        inst.uninstall()


# ------------------------------------------------------------------ passes --
def _build_passes(pipeline: str) -> list[ModulePass]:
    return list(parse_pipeline(pipeline).passes)


@dataclass(frozen=True)
class _Devices:
    """What the proto says about devices and its text form does not."""

    replicas: int
    partitions: int
    replicated: list[bool] | None  # per ENTRY parameter

    @property
    def count(self) -> int:
        return self.replicas * self.partitions

    def parse(self, text: str):
        """`text` parsed, with the device counts and replicated parameters passes need."""
        module = parse_module(text, "<xla module>")
        module.copies_inserted = True  # both hook stages come after XLA's copy insertion
        if self.partitions > 1:
            module.num_partitions = self.partitions
        if self.replicas > 1:
            module.set_header_attr("replica_count", self.replicas)
        mark_replicated_parameters(module, self.replicated)
        return module


def mark_replicated_parameters(module, replicated: list[bool] | None) -> None:
    """`parameter_replication={true}` on each ENTRY parameter that JAX replicated before partitioning.

    XLA's text form of the module loses this (it lives in the proto's
    `spmd_parameters_shardings`); passes such as weight-update-sharding need it to know that
    a weight is the same on every device."""
    if not replicated or module.entry is None:
        return
    for param in module.entry.parameters:
        if (param is not None and param.parameter_number < len(replicated) and replicated[param.parameter_number]
                and param.shape.is_array and "parameter_replication" not in param.attributes):
            param.set_attr("parameter_replication", (True,))


# What XLA:CPU's thunk emitter compiles outside a fusion once its fusion passes have run: a
# pass that leaves any other op standalone in a scheduled module (an all-reduce folded into a
# multiply) fails the jit, which the numeric check cannot see (it compiles from the start).
_CPU_UNFUSED = frozenset({
    Opcode.FUSION, Opcode.COPY, Opcode.CUSTOM_CALL, Opcode.DOT, Opcode.CONVOLUTION, Opcode.WHILE,
    Opcode.CONDITIONAL, Opcode.CALL, Opcode.TUPLE, Opcode.GET_TUPLE_ELEMENT, Opcode.PARAMETER, Opcode.CONSTANT,
    Opcode.BITCAST, Opcode.SORT, Opcode.ALL_REDUCE, Opcode.ALL_GATHER, Opcode.REDUCE_SCATTER, Opcode.ALL_TO_ALL,
    Opcode.COLLECTIVE_PERMUTE, Opcode.PARTITION_ID, Opcode.REPLICA_ID, Opcode.AFTER_ALL, Opcode.ADD_DEPENDENCY,
    Opcode.RNG_GET_AND_UPDATE_STATE, Opcode.RNG_BIT_GENERATOR, Opcode.INFEED, Opcode.OUTFEED, Opcode.FFT,
    Opcode.TOPK, Opcode.OPTIMIZATION_BARRIER})


def _cpu_rejects(module, names_before: set[str], stage: str) -> str | None:
    """Why XLA:CPU cannot compile what a pass added at this stage, or None: asynchronous
    collectives (its thunk emitter takes only the synchronous ones, at either stage), and after
    scheduling any new op outside a fusion it does not emit standalone."""
    fused = module.fused_computations()
    for comp in module.computations:
        if comp in fused:
            continue
        for instr in comp.instructions:
            if instr.name in names_before:
                continue
            if instr.opcode.value.endswith(("-start", "-done")):
                return f"XLA:CPU compiles no asynchronous {instr.opcode.value} here ({instr.name})"
            if stage == "post-scheduler" and instr.opcode not in _CPU_UNFUSED:
                return (f"after scheduling XLA:CPU compiles no standalone {instr.opcode.value} "
                        f"({instr.name}; its fusion passes have run)")
    return None


def _run_checked(pipeline: str, module, remarks: list[Remark], cpu_stage: str | None = None) -> list[str]:
    """Run the pipeline (the pass manager, verifying every pass); return the names of the passes
    that changed the module.

    A pass that raises, leaves a module the structural verifier rejects, changes the entry
    computation's parameter or result shapes (JAX fixed them: it passes and expects buffers of
    those shapes), or shares a buffer that copy insertion kept apart (ir/buffers.py: the module
    goes to buffer assignment as it is, and the numeric check, which compiles both modules
    from the start, cannot see it), or (`cpu_stage`) adds what XLA:CPU cannot compile at this
    stage (`_cpu_rejects`) raises _Rejected naming that pass.
    """
    signature = entry_signature(module)
    sharing = in_place_sharing(module)

    def same_signature(m) -> str | None:
        if entry_signature(m) != signature:
            return ("it changes the entry computation's parameter or result shapes, which JAX fixed when it "
                    "lowered the function")
        return None

    def buffers_kept_apart(m) -> str | None:
        problems = new_sharing(sharing, in_place_sharing(m))
        if problems:
            return ("it shares a buffer XLA's copy insertion, which has run at this stage, kept apart: "
                    + "; ".join(problems[:3]) + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""))
        return None

    names_before = {i.name for i in module.all_instructions()} if cpu_stage is not None else set()

    def cpu_compiles(m) -> str | None:
        return _cpu_rejects(m, names_before, cpu_stage) if cpu_stage is not None else None

    manager = PassManager(_build_passes(pipeline), verify_each=True,
                          invariants=[same_signature, buffers_kept_apart, cpu_compiles])
    try:
        manager.run(module)
    except PassFailed as e:
        raise _Rejected(e.pass_name, str(e).removeprefix(f"pass {e.pass_name}: ")) from e
    except Exception as e:  # noqa: BLE001 - a pass bug becomes a fallback, not a failed jit
        raise _Rejected(manager.failed_pass or pipeline, f"raised {type(e).__name__}: {e}") from e
    finally:
        remarks.extend(manager.remarks)
    return [r.name.split("{")[0] for r in manager.records if r.changed]


def entry_signature(module) -> tuple:
    """The ENTRY parameters' and result's shapes: element types, dimensions, layouts (default when absent)."""
    def leaves(shape):
        if shape.is_tuple:
            return tuple(leaves(e) for e in shape.elements)
        layout = shape.layout.minor_to_major if shape.layout is not None else tuple(range(shape.rank - 1, -1, -1))
        return (shape.element_type, tuple(shape.dims), layout)

    entry = module.entry
    return tuple(leaves(p.shape) for p in entry.parameters), leaves(entry.root.shape)


def _compare(original: str, rewritten: str, num_devices: int, replicated: list[bool] | None):
    return compare_per_device(as_fresh_program(original), as_fresh_program(rewritten),
                              num_devices=num_devices, replicated=replicated)


def _first_mismatching_pass(pipeline: str, original: str, devices: _Devices) -> str:
    """Re-run the pipeline on `original`, comparing after every pass that changed something;
    the first pass whose output differs (or raises, or does not compile)."""
    class Found(Exception):
        pass

    before = [original]

    def compare(index, p, module, changed) -> None:
        if not changed:
            return
        after = print_module(module)
        try:
            same = _compare(before[0], after, devices.count, devices.replicated).ok
        except Exception:  # noqa: BLE001 - does not compile: this pass is the culprit
            same = False
        if not same:
            raise Found(p.name)
        before[0] = after

    manager = PassManager(_build_passes(pipeline), after_each=compare)
    try:
        manager.run(devices.parse(original))
    except Found as found:
        return found.args[0]
    except Exception:  # noqa: BLE001 - it raises this time: it is the culprit
        return manager.failed_pass or pipeline
    return pipeline


# ------------------------------------------------------------------- proto --
def device_assignment(proto: bytes) -> tuple[int, int]:
    """(replica_count, computation_count) of a serialized HloModuleProto's device assignment.

    The module's text form does not carry them.  Reads the protobuf wire format directly:
    HloModuleProto.device_assignment is field 15, DeviceAssignmentProto.replica_count is
    field 1 and computation_count field 2.  (1, 1) when absent.
    """
    for number, value in _fields(proto):
        if number == 15 and isinstance(value, (bytes, memoryview)):
            counts = {n: v for n, v in _fields(bytes(value)) if isinstance(v, int)}
            return max(counts.get(1, 1), 1), max(counts.get(2, 1), 1)
    return 1, 1


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """Top-level (field number, value) pairs of a protobuf message: ints for varints, bytes otherwise."""
    pos, end = 0, len(data)

    def varint() -> int:
        nonlocal pos
        result = shift = 0
        while True:
            byte = data[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return result

    while pos < end:
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            yield number, varint()
        elif wire == 1:
            yield number, data[pos:pos + 8]
            pos += 8
        elif wire == 2:
            length = varint()
            yield number, data[pos:pos + length]
            pos += length
        elif wire == 5:
            yield number, data[pos:pos + 4]
            pos += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")


# ----------------------------------------------------------------- helpers --
def _warn(message: str) -> None:
    """Warn without ever raising: under `-W error` a warning is an exception, which must not reach XLA."""
    log.warning(message)
    try:
        warnings.warn(message, HookFallback, stacklevel=2)
    except Exception:  # noqa: BLE001 - the log line above already says it
        pass


def _warn_if_persistent_cache() -> None:
    import jax

    cache_dir = getattr(jax.config, "jax_compilation_cache_dir", None)
    if cache_dir:
        warnings.warn(f"JAX's persistent compilation cache is on ({cache_dir}): cached executables skip the "
                      "hlo-passes hook, and executables compiled under it are cached under XLA's key",
                      HookFallback, stacklevel=3)
