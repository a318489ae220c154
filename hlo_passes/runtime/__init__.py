"""Numerical verification through JAX's XLA backend.

    from hlo_passes.runtime import verify_equivalent, execute_module
    report = verify_equivalent(original, rewritten)   # Module objects or HLO text
    outputs = execute_module(text, num_devices=4)      # global outputs as numpy arrays

Layout: xla_backend.py (the only user of jaxlib's private APIs: compile, run,
cache), inputs.py (deterministic inputs, .npz files), compare.py (tolerances),
partitioned.py (shards of global arrays, manual per-device programs, XLA's SPMD
partitioner), verify.py (choosing the running mode, the report).
"""

from hlo_passes.runtime.compare import OutputStats, compare_arrays, default_tolerance
from hlo_passes.runtime.inputs import load_npz, random_inputs, save_npz
from hlo_passes.runtime.verify import (VerificationError, VerificationReport, execute_module,
                                       verify_equivalent)
from hlo_passes.runtime.xla_backend import BackendUnavailable

__all__ = ["BackendUnavailable", "OutputStats", "VerificationError", "VerificationReport", "compare_arrays",
           "default_tolerance", "execute_module", "load_npz", "random_inputs", "save_npz",
           "verify_equivalent"]
