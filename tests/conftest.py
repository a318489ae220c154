"""Shared pytest set-up.  JAX must see 8 virtual CPU devices, so XLA_FLAGS is set
before anything imports jax."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true",
                     help="rewrite golden/**/*.expected.hlo from the current passes and print what changed")
    parser.addoption("--fuzz", type=int, default=400, metavar="N",
                     help="mutants the front-end fuzz test reads (default 400; `make fuzz` runs 20000)")
    parser.addoption("--fuzz-seed", type=int, default=0, metavar="S", help="seed of the fuzz test's mutants")
