"""XLA as the oracle of the verifier tests: its parser, then its verifier (run when the
module is compiled for the CPU backend with the module's replica/partition counts)."""

from __future__ import annotations

import re


def xla_rejects(text: str) -> str | None:
    """XLA's complaint about `text`, or None when it parses and compiles."""
    from hlo_passes.runtime import xla_backend

    try:
        xla_backend.parse_with_xla(text)
    except Exception as e:  # noqa: BLE001 - the message is the verdict
        return f"parser: {e}"
    replicas = int(m.group(1)) if (m := re.search(r"replica_count=(\d+)", text)) else 1
    partitions = int(m.group(1)) if (m := re.search(r"num_partitions=(\d+)", text)) else 1
    try:
        xla_backend.compile_hlo(text, num_replicas=replicas, num_partitions=partitions, spmd=partitions > 1)
    except xla_backend.BackendUnavailable:
        raise
    except Exception as e:  # noqa: BLE001
        return f"compiler: {e}"
    return None
