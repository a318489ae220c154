"""Compiling and running HLO text through JAX's XLA backend.

jaxlib's private APIs are used here, in hlo_proto.py and in per_device.py only;
they are tested with jax/jaxlib 0.12.0.1.
"""

from __future__ import annotations

import os

import numpy as np

PINNED = "jax/jaxlib 0.12.0.1"


def ensure_devices(n: int) -> None:
    """Ask for n virtual CPU devices if JAX has not started yet; explain when it has."""
    flag = f"--xla_force_host_platform_device_count={max(n, 8)}"
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = (flags + " " + flag).strip()
    import jax

    have = len(jax.devices("cpu"))
    if have < n:
        raise RuntimeError(f"{n} CPU devices needed but JAX started with {have}; set "
                           f"XLA_FLAGS={flag} before JAX is first used")


def _client():
    try:
        from jax._src import xla_bridge
        from jax._src.lib import xla_client as xc
    except ImportError as e:  # pragma: no cover - depends on the installed jaxlib
        raise RuntimeError(f"jaxlib's private XLA APIs are missing ({e}); hlo-passes needs {PINNED}") from e
    return xla_bridge, xc


def exact_dtypes():
    """A context in which 64-bit inputs are not narrowed to 32 bits by JAX."""
    from jax._src import config

    return config.enable_x64(True)


_cache: dict[str, object] = {}


def run_single(text: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Compile `text` for one CPU device (cached per text) and run it on `inputs`."""
    import jax

    xla_bridge, xc = _client()
    exe = _cache.get(text)
    client = xla_bridge.get_backend("cpu")
    if exe is None:
        hlo = xc.hlo.hlo_module_from_text(text)
        stablehlo = xc._xla.mlir.hlo_to_stablehlo(hlo.as_serialized_hlo_module_proto())
        options = xc.CompileOptions()
        options.executable_build_options.num_replicas = 1
        options.executable_build_options.num_partitions = 1
        exe = client.compile_and_load(stablehlo, xc.DeviceList((client.devices()[0],)), options)
        _cache[text] = exe
    device = client.devices()[0]
    with exact_dtypes():
        args = [jax.device_put(x, device) for x in inputs]
    results = exe.execute_sharded(args).disassemble_into_single_device_arrays()
    return [np.asarray(r[0]) for r in results]
