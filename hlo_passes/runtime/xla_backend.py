"""Compiling and running HLO text through JAX's XLA backend.

This is the one module of hlo-passes that touches jaxlib's private APIs
(`jax._src.lib.xla_client`, `jax._src.xla_bridge`, `jax._src.compiler`).  They
change between releases without notice; hlo-passes is tested with
jax/jaxlib 0.12.0.1 and raises `BackendUnavailable` naming that version when an
API it needs is missing.

    ensure_devices(8)                                    # before JAX starts: 8 virtual CPU devices
    exe = compile_hlo(text, num_partitions=4, spmd=True) # cached per (text, options)
    outs = exe.run(per_device_args)                      # outs[device][output]

`per_device_args[p][d]` is parameter p's buffer on device d (tuple-shaped
parameters already flattened into their leaves, the way PJRT passes them).
How global arrays become per-device buffers (slicing by shardings) is the
caller's business, see `partitioned.py`.

Compiled executables are cached within the process, keyed by the module text
and every compile option, so verifying many rewrites of one original compiles
the original once.
"""

from __future__ import annotations

import contextlib
import os
import re
import statistics
import time
from dataclasses import dataclass

import numpy as np

PINNED = "jax/jaxlib 0.12.0.1"
_DEVICE_FLAG = "--xla_force_host_platform_device_count"


class BackendUnavailable(RuntimeError):
    """jaxlib's private XLA APIs are missing or changed, or the devices asked for are unavailable."""


# ------------------------------------------------------------ private APIs --
@dataclass(frozen=True)
class _Api:
    jax: object
    xc: object          # jax._src.lib.xla_client
    xla_bridge: object  # jax._src.xla_bridge
    compiler: object    # jax._src.compiler


_api_cache: list[_Api] = []


def _api() -> _Api:
    """jaxlib's private APIs, checked once; BackendUnavailable names the pinned version."""
    if _api_cache:
        return _api_cache[0]
    try:
        import jax
        from jax._src import compiler, xla_bridge
        from jax._src.lib import xla_client as xc
    except ImportError as e:
        raise BackendUnavailable(f"cannot import jax's XLA internals ({e}); hlo-passes needs {PINNED}") from e
    needed = {
        "xla_client.hlo.hlo_module_from_text": lambda: xc.hlo.hlo_module_from_text,
        "xla_client.hlo.HloModule.from_serialized_hlo_module_proto":
            lambda: xc.hlo.HloModule.from_serialized_hlo_module_proto,
        "xla_client._xla.mlir.hlo_to_stablehlo": lambda: xc._xla.mlir.hlo_to_stablehlo,
        "xla_client.DeviceList": lambda: xc.DeviceList,
        "xla_client.DeviceAssignment.create": lambda: xc.DeviceAssignment.create,
        "xla_client.HloSharding.from_proto": lambda: xc.HloSharding.from_proto,
        "compiler.get_compile_options": lambda: compiler.get_compile_options,
        "xla_bridge.get_backend": lambda: xla_bridge.get_backend,
        "xla_client._xla.hlo_module_cost_analysis": lambda: xc._xla.hlo_module_cost_analysis,
    }
    missing = []
    for name, get in needed.items():
        try:
            get()
        except AttributeError:
            missing.append(name)
    if missing:
        raise BackendUnavailable(f"jax {jax.__version__} lacks {', '.join(missing)}; hlo-passes' runtime "
                                 f"uses jaxlib's private APIs and is tested with {PINNED}")
    _api_cache.append(_Api(jax, xc, xla_bridge, compiler))
    return _api_cache[0]


def quiet_cpp_logs() -> None:
    """Keep XLA's C++ warnings (e.g. the GSPMD deprecation notice) off the terminal; its errors
    still arrive as exceptions.  An explicit TF_CPP_MIN_LOG_LEVEL wins.  The variable is read
    when XLA starts, so once jaxlib is loaded absl's level is also set directly."""
    if "TF_CPP_MIN_LOG_LEVEL" in os.environ:
        return
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    try:
        from jax._src.lib import utils

        utils.absl_set_min_log_level(2)
    except (ImportError, AttributeError):  # older jaxlib: the environment variable is all there is
        pass


def _jax_started() -> bool:
    """Has JAX created its backends (after which XLA_FLAGS is no longer read)?"""
    import sys

    bridge = sys.modules.get("jax._src.xla_bridge")
    return bool(bridge is not None and getattr(bridge, "_backends", None))


def ensure_devices(n: int, platform: str | None = None) -> None:
    """Make sure `n` devices of `platform` (default CPU) exist.

    On CPU, before JAX starts, this asks for max(n, 8) virtual devices through XLA_FLAGS
    (raising a smaller count already there: the module decides); once JAX has started with
    fewer, it explains how to restart.
    """
    platform = platform or "cpu"
    if platform == "cpu" and not _jax_started() and not _joined:  # a joined process keeps its share
        flags = os.environ.get("XLA_FLAGS", "")
        asked = re.search(rf"{_DEVICE_FLAG}=(\d+)", flags)
        if asked is None:
            os.environ["XLA_FLAGS"] = f"{flags} {_DEVICE_FLAG}={max(n, 8)}".strip()
        elif int(asked.group(1)) < n:  # the module needs more than the environment asks for
            os.environ["XLA_FLAGS"] = flags.replace(asked.group(0), f"{_DEVICE_FLAG}={n}")
    api = _api()
    try:
        have = len(api.jax.devices(platform))
    except RuntimeError as e:
        raise BackendUnavailable(f"no {platform} backend: {str(e).splitlines()[0]}") from None
    if have < n:
        hint = (f"start the process with XLA_FLAGS={_DEVICE_FLAG}={n} (it is read once, when JAX first "
                "creates its CPU client, so it must be set before anything uses jax)"
                if platform == "cpu" else f"run on a machine with {n} {platform} devices")
        raise BackendUnavailable(f"{n} {platform} devices needed but JAX has {have}; {hint}")


def devices(n: int, platform: str | None = None) -> list:
    """The first n devices.  With several processes (`init_distributed`) one device is this
    process's own, and a multi-device program takes every device of every process: all of
    them run it, each feeding and reading its own devices."""
    ensure_devices(n, platform)
    jax = _api().jax
    if jax.process_count() == 1:
        return list(jax.devices(platform or "cpu"))[:n]
    if n == 1:
        return [jax.local_devices(backend=platform or "cpu")[0]]
    everywhere = list(jax.devices(platform or "cpu"))
    if n != len(everywhere):
        raise BackendUnavailable(f"a {n}-device program across {jax.process_count()} processes needs "
                                 f"exactly {n} devices in all; the processes have {len(everywhere)}")
    return everywhere


# ------------------------------------------------------- several processes --
def init_distributed(coordinator: str, num_processes: int, process_id: int, local_devices: int,
                     platform: str | None = None) -> None:
    """Join a multi-process JAX system before anything else starts JAX: `local_devices` CPU
    devices in this process, collectives between processes over gloo (CPU), or the
    platform's own (GPU hosts).  The same call on every process, as JAX's own
    `jax.distributed.initialize` wants it; then `devices`, `compile_hlo` and
    `Executable.run` work on the devices of all processes."""
    if _jax_started():
        raise BackendUnavailable("JAX already started in this process; a distributed run must join first")
    if (platform or "cpu") == "cpu":
        flags = re.sub(rf"{_DEVICE_FLAG}=\d+", "", os.environ.get("XLA_FLAGS", "")).strip()
        os.environ["XLA_FLAGS"] = f"{flags} {_DEVICE_FLAG}={local_devices}".strip()
    jax = _api().jax
    if (platform or "cpu") == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                               process_id=process_id)
    _joined.append(num_processes)


_joined: list[int] = []  # set once this process has joined a multi-process run


def process_index() -> int:
    """This process's index in a multi-process run (0 in a single process)."""
    return _api().jax.process_index() if _jax_started() else 0


def exact_dtypes():
    """A context in which 64-bit inputs are not narrowed to 32 bits by JAX."""
    try:
        from jax._src import config
    except ImportError:  # pragma: no cover - depends on the installed jax
        return contextlib.nullcontext()
    return config.enable_x64(True)


# -------------------------------------------------------------- HLO protos --
def text_to_proto(text: str) -> bytes:
    """A serialized HloModuleProto from HLO text; XLA's parser raises on text it rejects."""
    return _api().xc.hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto()


def proto_to_text(proto: bytes) -> str:
    """XLA's text for a serialized HloModuleProto."""
    return _api().xc.hlo.HloModule.from_serialized_hlo_module_proto(proto).to_string()


def parse_with_xla(text: str):
    """XLA's C++ parser on `text` (its HloModule; for timing it against ours)."""
    return _api().xc.hlo.hlo_module_from_text(text)


def cost_analysis(text: str, platform: str | None = None) -> dict[str, float]:
    """XLA's HloCostAnalysis of a module as it stands (no optimization): `flops`, `bytes
    accessed`, ... — the FLOPs benchmarks compare."""
    api = _api()
    module = api.xc.hlo.hlo_module_from_text(text)
    return dict(api.xc._xla.hlo_module_cost_analysis(api.xla_bridge.get_backend(platform or "cpu"), module))


def canonical_text(text: str) -> str:
    """XLA's own print of `text` (its parser, then its printer; module config kept)."""
    return _api().xc.hlo.hlo_module_from_text(text).to_string()


def proto_parameter_replicated(proto: bytes) -> list[bool] | None:
    """Per entry parameter: was it replicated before SPMD partitioning (`spmd_parameters_shardings`)?"""
    xc = _api().xc
    module = xc.hlo.HloModule.from_serialized_hlo_module_proto(proto)
    shardings = module.spmd_parameters_shardings
    if not shardings:
        return None
    return [xc.HloSharding.from_proto(s).is_replicated() for s in shardings]


# ------------------------------------------------------------- executables --
@dataclass(frozen=True)
class CompileOptions:
    """How a module is compiled: replicas × partitions devices, through the SPMD partitioner or not."""

    num_replicas: int = 1
    num_partitions: int = 1
    spmd: bool = False  # run XLA's SPMD partitioner (needed for num_partitions > 1)
    platform: str = "cpu"
    # XLA may choose the sharding of output i when propagate_to_output[i] (one entry: all outputs)
    propagate_to_output: tuple[bool, ...] = ()
    # ... and of parameter i when propagate_to_parameters[i] (the module header's flags)
    propagate_to_parameters: tuple[bool, ...] = ()
    shardy: bool = False  # XLA's Shardy partitioner (modules in JAX's Shardy form) instead of GSPMD

    @property
    def num_devices(self) -> int:
        return self.num_replicas * self.num_partitions


class Executable:
    """A compiled module and the devices it runs on."""

    def __init__(self, loaded, devices: list, options: CompileOptions):
        self._loaded = loaded
        self.devices = devices
        self.options = options

    def parameter_shardings(self) -> list[str] | None:
        """XLA's sharding of each (flattened) parameter as HLO text, after SPMD propagation."""
        return self._shardings(self._loaded.get_parameter_shardings())

    def output_shardings(self) -> list[str] | None:
        """XLA's sharding of each (flattened) output as HLO text, after SPMD propagation."""
        return self._shardings(self._loaded.get_output_shardings())

    def _shardings(self, protos) -> list[str] | None:
        if protos is None:
            return None
        xc = _api().xc
        return [xc.HloSharding.from_proto(p).to_string() for p in protos]

    def upload(self, args: list[list[np.ndarray]]) -> list:
        """Per-device buffers (`args[param][device]`) as device arrays this executable takes.
        With several processes each puts only its own devices' buffers."""
        jax = _api().jax
        n = len(self.devices)
        for p, per_device in enumerate(args):
            if len(per_device) != n:
                raise ValueError(f"parameter {p}: {len(per_device)} buffers for {n} devices")
        mesh = jax.sharding.Mesh(np.array(self.devices), ("devices",))
        # A "replicated" global array whose per-device buffers differ: the executable reads only
        # each device's own buffer, so any per-device values can be passed this way.
        everywhere = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        mine = self._local_positions()
        with exact_dtypes():
            return [jax.make_array_from_single_device_arrays(
                        per_device[0].shape, everywhere,
                        [jax.device_put(np.asarray(per_device[i]), self.devices[i]) for i in mine])
                    for per_device in args]

    def _local_positions(self) -> list[int]:
        here = _api().jax.process_index()
        return [i for i, d in enumerate(self.devices) if d.process_index == here]

    def run(self, args: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
        """Run on per-device buffers (`args[param][device]`); return `outputs[device][output]`,
        for every device (with several processes, gathered from all of them)."""
        arrays = self.upload(args)
        with exact_dtypes():
            results = self._loaded.execute_sharded(arrays).disassemble_into_single_device_arrays()
            # a program without outputs (`() -> ()`) still ran on every device: one empty list each
            local = [[np.asarray(out[k]) for out in results]
                     for k in range(len(results[0]) if results else len(self._local_positions()))]
        if _api().jax.process_count() == 1:
            return local
        return self._gather(local, len(results))

    def _gather(self, local: list[list[np.ndarray]], count: int) -> list[list[np.ndarray]]:
        """Every device's outputs in every process: each output's per-device buffers (one shape
        on all devices of an SPMD program) are stacked and all-gathered across processes."""
        from jax.experimental import multihost_utils  # only multi-process runs need it

        positions = np.asarray(self._local_positions())
        where = np.asarray(multihost_utils.process_allgather(positions)).reshape(-1)
        outputs: list[list[np.ndarray | None]] = [[None] * count for _ in self.devices]
        for leaf in range(count):
            stacked = np.stack([dev[leaf] for dev in local])
            with exact_dtypes():
                everyone = np.asarray(multihost_utils.process_allgather(stacked))
            everyone = everyone.reshape((-1,) + stacked.shape[1:])
            for position, value in zip(where, everyone):
                outputs[int(position)][leaf] = value
        return outputs  # type: ignore[return-value]

    def median_step_seconds(self, args: list[list[np.ndarray]], repeats: int, warmup: int = 3) -> float:
        """Median wall time of one run (inputs already on the devices, outputs waited for)."""
        jax = _api().jax
        arrays = self.upload(args)
        times = []
        for i in range(warmup + repeats):
            start = time.perf_counter()
            jax.block_until_ready(self._loaded.execute_sharded(arrays).disassemble_into_single_device_arrays())
            if i >= warmup:
                times.append(time.perf_counter() - start)
        return statistics.median(times)

    def optimized_text(self) -> str:
        """The module XLA compiled, after its own optimization pipeline."""
        return self._loaded.hlo_modules()[0].to_string()


_executables: dict[tuple[str, CompileOptions], Executable] = {}


def compile_hlo(text: str, *, num_replicas: int = 1, num_partitions: int = 1, spmd: bool = False,
                platform: str | None = None, propagate_to_output: tuple[bool, ...] = (),
                shardy: bool = False, propagate_to_parameters: tuple[bool, ...] = ()) -> Executable:
    """Compile HLO text for num_replicas × num_partitions devices (cached per text and options).

    XLA's own errors (parse, verifier, partitioner) propagate as the exception XLA raised.
    """
    options = CompileOptions(num_replicas=num_replicas, num_partitions=num_partitions, spmd=spmd,
                             platform=platform or "cpu", propagate_to_output=tuple(propagate_to_output),
                             propagate_to_parameters=tuple(propagate_to_parameters), shardy=shardy)
    key = (text, options)
    exe = _executables.get(key)
    if exe is None:
        exe = _executables[key] = _compile(text, options, {})
    return exe


def pass_dump(text: str, pass_name: str, *, num_partitions: int, shardy: bool = False,
              propagate_to_output: tuple[bool, ...] = (), propagate_to_parameters: tuple[bool, ...] = (),
              platform: str | None = None, dump_dir: str | None = None) -> str:
    """XLA's module right after its pass `pass_name` (e.g. "spmd-partitioning"), when XLA compiles
    `text` for `num_partitions` devices with SPMD partitioning — how benchmarks read XLA's own
    partition beside ours.

    `dump_dir`: write the dump there and keep it.  A later pass of the compile may fail (the
    dump is then still returned) or abort the process (a CHECK): a caller running XLA in a
    worker process reads the dump from there after the worker died."""
    import tempfile
    from pathlib import Path

    options = CompileOptions(num_partitions=num_partitions, spmd=True, platform=platform or "cpu",
                             propagate_to_output=tuple(propagate_to_output),
                             propagate_to_parameters=tuple(propagate_to_parameters), shardy=shardy)
    with tempfile.TemporaryDirectory() if dump_dir is None else contextlib.nullcontext(dump_dir) as d:
        error: Exception | None = None
        try:
            _compile(text, options, {"xla_dump_to": d, "xla_dump_hlo_pass_re": pass_name,
                                     "xla_dump_hlo_as_text": True})
        except Exception as e:  # noqa: BLE001 - a pass after `pass_name` failed: its dump is the answer
            error = e
        found = sorted(Path(d).glob(f"*after_{pass_name}*.txt"))
        if not found:
            if error is not None:
                raise error
            raise BackendUnavailable(f"XLA wrote no dump after {pass_name}")
        return found[-1].read_text()


def _compile(text: str, options: CompileOptions, debug: dict) -> Executable:
    api = _api()
    _ensure_lapack(text)
    devs = devices(options.num_devices, options.platform)
    xc = api.xc
    hlo = xc.hlo.hlo_module_from_text(without_aliasing(text))
    stablehlo = xc._xla.mlir.hlo_to_stablehlo(hlo.as_serialized_hlo_module_proto())
    compile_options = api.compiler.get_compile_options(num_replicas=options.num_replicas,
                                                       num_partitions=options.num_partitions)
    build = compile_options.executable_build_options
    build.use_spmd_partitioning = options.spmd
    # Text in GSPMD form goes through the GSPMD partitioner: XLA's Shardy import aborts the
    # process (a CHECK, not an exception) on some GSPMD shardings.  Text in JAX's Shardy form
    # (xla.sdy.* attributes) goes through Shardy, as JAX compiles it.
    build.use_shardy_partitioner = options.shardy
    if options.propagate_to_output:
        build.allow_spmd_sharding_propagation_to_output = list(options.propagate_to_output)
    if options.propagate_to_parameters:
        build.allow_spmd_sharding_propagation_to_parameters = list(options.propagate_to_parameters)
    for key, value in debug.items():
        setattr(build.debug_options, key, value)
    # Device ids, not positions: with several processes they are not 0..n-1.
    build.device_assignment = xc.DeviceAssignment.create(
        np.array([d.id for d in devs]).reshape(options.num_replicas, options.num_partitions))
    backend = api.xla_bridge.get_backend(options.platform)
    loaded = backend.compile_and_load(stablehlo, xc.DeviceList(tuple(devs)), compile_options)
    return Executable(loaded, devs, options)


def without_aliasing(text: str) -> str:
    """`text` without the header's `input_output_alias` and `buffer_donor`, as every module is
    compiled here.  JAX aliases a donated parameter with an output of the same per-device
    shape, which may be another global shape (a [8,1] parameter tiled 8 ways donated to a
    replicated [1,1] output: JAX fuzz seed 3506); XLA checks the aliasing on the module it is
    given, the global one when it partitions it or runs it on one device, and refuses it
    ("Expected aliased input 3 ... to have the same size"), though JAX compiled the same
    program.  Aliasing only lets an output reuse an input's buffer: the values are the same
    without it (and the caller's input buffers stay valid for its next run)."""
    end = text.find("\n")
    header, rest = (text, "") if end < 0 else (text[:end], text[end:])
    if not header.lstrip().startswith("HloModule"):
        return text
    for key in ("input_output_alias=", "buffer_donor="):
        start = header.find(key)
        if start < 0:
            continue
        depth, k = 0, start + len(key)
        while k < len(header):
            depth += {"{": 1, "}": -1}.get(header[k], 0)
            k += 1
            if depth == 0:
                break
        while k < len(header) and header[k] in ", ":
            k += 1
        header = header[:start] + header[k:]
    return header.rstrip(", ") + rest


_lapack_ready: list[bool] = []


def _ensure_lapack(text: str) -> None:
    """JAX fills jaxlib's table of LAPACK routines the first time it lowers a linear-algebra op.
    A module that calls the LAPACK custom-calls (`lapack_spotrf_ffi`, ...) before that — one read
    from a dump — would crash the process at run time, so the table is filled first."""
    if _lapack_ready or 'custom_call_target="lapack_' not in text:
        return
    try:
        from jaxlib import lapack

        lapack._lapack.initialize()
    except (ImportError, AttributeError) as e:
        raise BackendUnavailable(f"cannot initialise jaxlib's LAPACK routines ({e}); hlo-passes needs {PINNED}") from e
    _lapack_ready.append(True)


def clear_cache() -> None:
    _executables.clear()


def run_single(text: str, inputs: list[np.ndarray], platform: str | None = None) -> list[np.ndarray]:
    """Compile `text` for one device (cached) and run it on `inputs` (flattened parameters)."""
    exe = compile_hlo(text, platform=platform)
    return exe.run([[x] for x in inputs])[0]


def xla_error_lines(error: BaseException, limit: int = 8) -> list[str]:
    """The useful lines of an XLA error: no stack traces, source-location trailers or blank lines."""
    lines = []
    for line in str(error).splitlines():
        s = line.strip()
        if not s:
            continue
        if s.startswith(("***", "=== Source Location", "external/", "Suspected Python")):
            break
        lines.append(s)
    return lines[:limit] or [type(error).__name__]


# ------------------------------------------------------------ pass timing --
# XLA's HloPassPipeline logs each pass it runs (at VLOG 1 of hlo_pass_pipeline.cc), e.g.
#   hlo_pass_pipeline.cc:206] HLO pass: spmd-partitioning time: 527 us (527 us) (cumulative: ...)
_PASS_TIME_LINE = re.compile(r"\] HLO pass: (\S+) time: ([\d.]+) ?(ns|us|ms|s|min|h)\b")
_LOG_LINE = re.compile(r"[IWEF]\d{4} ")  # glog's prefix: severity, month, day
_SECONDS_PER_UNIT = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}


def pass_times(text: str, *, num_partitions: int, shardy: bool = False,
               propagate_to_output: tuple[bool, ...] = (), propagate_to_parameters: tuple[bool, ...] = (),
               timeout: float | None = None) -> dict[str, float]:
    """Seconds XLA spends in each of its passes (by XLA's pass name, e.g. "sharding-propagation",
    "spmd-partitioning", "shardy-xla"; a pass that runs several times is summed) when it compiles
    `text` for `num_partitions` devices with SPMD partitioning — the figures benchmarks put beside
    our passes' times.

    XLA reports these only in its log, and reads the log's verbosity and its device count when it
    starts, so the compile runs in a child process (`hlo_passes.runtime.xla_pass_timer`) started
    with TF_CPP_VMODULE=hlo_pass_pipeline=1; its log is parsed here.  Note XLA's figure for a pass
    is wall time, and "spmd-partitioning" includes the cleanup pipeline it runs inside.

    Raises BackendUnavailable when the child fails, and subprocess.TimeoutExpired after `timeout`.
    """
    import subprocess
    import sys
    import tempfile

    env = dict(os.environ)
    flags = re.sub(rf"{_DEVICE_FLAG}=\d+", "", env.get("XLA_FLAGS", "")).strip()
    env["XLA_FLAGS"] = f"{flags} {_DEVICE_FLAG}={num_partitions}".strip()
    env["TF_CPP_VMODULE"] = "hlo_pass_pipeline=1"
    env["TF_CPP_MIN_LOG_LEVEL"] = "0"
    env.setdefault("JAX_PLATFORMS", "cpu")
    with tempfile.NamedTemporaryFile("w", suffix=".hlo") as f:
        f.write(text)
        f.flush()
        argv = [sys.executable, "-m", "hlo_passes.runtime.xla_pass_timer", f.name, str(num_partitions),
                "--shardy" if shardy else "--gspmd",
                "--propagate-to-output", ",".join("1" if b else "0" for b in propagate_to_output),
                "--propagate-to-parameters", ",".join("1" if b else "0" for b in propagate_to_parameters)]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:  # the child's last words (its exception), not XLA's log lines
        said = [line for line in done.stderr.splitlines() if line.strip() and not _LOG_LINE.match(line)]
        raise BackendUnavailable(f"XLA's compile for {num_partitions} devices failed (exit "
                                 f"{done.returncode}): {said[-1].strip() if said else '?'}")
    return _sum_pass_times(done.stderr)


def _sum_pass_times(log: str) -> dict[str, float]:
    """Seconds per pass name from XLA's pass-pipeline log, summed over the pass's runs."""
    seconds: dict[str, float] = {}
    for name, amount, unit in _PASS_TIME_LINE.findall(log):
        seconds[name] = seconds.get(name, 0.0) + float(amount) * _SECONDS_PER_UNIT[unit]
    return seconds
