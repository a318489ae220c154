"""XLA as the oracle of the verifier tests: its parser, then its verifier (run when the
module is compiled for the CPU backend with the module's replica/partition counts)."""

from __future__ import annotations

import re


def xla_rejects(text: str) -> str | None:
    """XLA's complaint about `text`, or None when it parses and compiles."""
    from jax._src import xla_bridge
    from jax._src.lib import xla_client as xc

    try:
        hlo = xc.hlo.hlo_module_from_text(text)
    except Exception as e:  # noqa: BLE001 - the message is the verdict
        return f"parser: {e}"
    replicas = int(m.group(1)) if (m := re.search(r"replica_count=(\d+)", text)) else 1
    partitions = int(m.group(1)) if (m := re.search(r"num_partitions=(\d+)", text)) else 1
    client = xla_bridge.get_backend("cpu")
    try:
        stablehlo = xc._xla.mlir.hlo_to_stablehlo(hlo.as_serialized_hlo_module_proto())
        options = xc.CompileOptions()
        options.executable_build_options.num_replicas = replicas
        options.executable_build_options.num_partitions = partitions
        options.executable_build_options.use_spmd_partitioning = partitions > 1
        devices = xc.DeviceList(tuple(client.devices()[:replicas * partitions]))
        client.compile_and_load(stablehlo, devices, options)
    except Exception as e:  # noqa: BLE001
        return f"compiler: {e}"
    return None
