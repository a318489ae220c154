"""The type checker CI runs: mypy over `hlo_passes/` with the configuration in pyproject.toml
(strict for `ir/`, `parse/`, the pass framework and `passes/spmd/`; the rest checked with its
errors ignored until each module is turned on).  Same as `make typecheck`."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                    reason="mypy is not installed (it is in the test extras: pip install -e '.[test]')")
def test_mypy_is_clean():
    # The incremental cache (.mypy_cache, git-ignored) makes a repeat run take a few seconds.
    result = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"mypy found type errors:\n{result.stdout}{result.stderr}"
