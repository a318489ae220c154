# Quick start:  make demo   (partition a Megatron MLP over 8 devices, fuse a DP step's collectives; verify both on 8 CPU devices)
#               make test   (the test suite; this is what CI runs)
# Both create .venv with Python 3.12 and the pinned jax/jaxlib when it is missing.

PYTHON312 ?= $(shell command -v python3.12 >/dev/null 2>&1 && python3.12 -c 'import sys' 2>/dev/null && echo python3.12 || echo $$(pyenv root 2>/dev/null || echo $$HOME/.pyenv)/versions/3.12.1/bin/python)
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: venv demo test bench bench-wus bench-view screenshots corpus clean check-dumps fuzz-dumps fuzz-spmd fuzz-propagation fuzz startup typecheck

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON312) -m venv $(VENV) || { echo "error: need Python >= 3.12 (set PYTHON312=/path/to/python3.12)"; exit 2; }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $@

venv: $(VENV)/.installed

demo: venv
	$(PY) -m hlo_passes run examples/megatron_mlp.hlo --passes=spmd-partition,collective-fusion --num-partitions=8 --stats --remarks -o out/megatron_mlp.partitioned.hlo
	$(PY) -m hlo_passes verify examples/megatron_mlp.hlo out/megatron_mlp.partitioned.hlo
	$(PY) -m hlo_passes run examples/dp_mlp_step.hlo --passes=collective-fusion --stats -o out/dp_mlp_step.fused.hlo
	$(PY) -m hlo_passes verify examples/dp_mlp_step.hlo out/dp_mlp_step.fused.hlo

test: venv
	$(PY) -m pytest -n 2 tests

# mypy over hlo_passes/ (pyproject.toml's [tool.mypy]: strict for ir/, parse/ and the pass framework); the suite runs it too.
typecheck: venv
	$(PY) -m mypy

# The dump workflow as a user runs it: JAX programs dumped by XLA (both lowerings), every command on every stage.
check-dumps: venv
	rm -rf out/dumps
	for l in shardy gspmd; do XLA_FLAGS="--xla_force_host_platform_device_count=8 --xla_dump_to=out/dumps/$$l --xla_dump_hlo_pass_re=spmd-partitioning" $(PY) tests/dumps/programs.py --lowering $$l || exit 1; done
	$(PY) tests/dumps/survey.py out/dumps/shardy out/dumps/gspmd

# Random JAX programs (random meshes, shardings, donation; both lowerings) dumped by XLA, every stage
# file through the CLI as users run it; non-ok seeds' dump directories are kept under out/fuzz-dumps.
fuzz-dumps: venv
	$(PY) tests/dumps/fuzz_jax_dumps.py --seeds $${SEEDS:-100} --start $${START:-0} --lowering $${LOWERING:-both} --show --keep out/fuzz-dumps

# Differential fuzzing of spmd-partition: random sharded modules against XLA's run of the original (long profile).
fuzz-spmd: venv
	$(PY) tests/spmd/fuzz_spmd.py --seeds $${SEEDS:-2000} --start $${START:-0}

# Random differential agreement of sharding-propagation with XLA's: per-opcode agreement and the
# disagreements grouped by rule (random modules with few annotations; a few minutes for 300).
fuzz-propagation: venv
	$(PY) benchmarks/fuzz_propagation.py --seeds $${SEEDS:-300} --start $${START:-0}

bench: venv
	$(PY) benchmarks/parse_speed.py

# weight-update-sharding on real Flax + Optax steps (GPT TP+DP, ResNet DP, ViT 2-D; 8 CPU devices), each
# verified numerically; needs the benchmark extras flax and optax (not in CI).
bench-wus: venv
	$(PY) benchmarks/weight_update_sharding.py --flax

# `hlo-passes view` on a GPT-24 training step (8 devices): page writing and Chromium open times.
bench-view: venv
	test -d bench-data/gpt24.dump || $(PY) benchmarks/gpt_dump.py
	$(PY) benchmarks/view_speed.py

# Our pass times beside XLA's own on generated JAX training steps (12-96 layers, 8-4096 devices); long.
# ARGS=--quick for a few minutes' run, or e.g. ARGS="--layers 24 --devices 8,256 --only gspmd".
.PHONY: bench-speed
bench-speed: venv
	$(PY) benchmarks/pass_speed.py $(ARGS)

# spmd-partition's collective bytes and FLOPs beside XLA's own partition on random JAX programs (fuzz_jax_dumps'
# generator), each verified; the worst seeds listed with their files. E.g. ARGS="--seeds 60 --lowering gspmd --jobs 2".
.PHONY: bench-random-quality
bench-random-quality: venv
	$(PY) benchmarks/jax_random_quality.py $(ARGS)

# The README's pictures (docs/*.png), with headless Chromium.
screenshots: venv
	$(PY) docs/make_screenshots.py

# The front-end fuzz test at length (CI runs 400 mutants), then how often XLA's parser agrees.
fuzz: venv
	$(PY) -m pytest -q tests/frontend/test_fuzz.py --fuzz=20000 --fuzz-seed=$${SEED:-1}
	$(PY) benchmarks/fuzz_agreement.py --count 2000 --seed $${SEED:-1}

# Start-up of `hlo-passes fmt` on a tiny module.
startup: venv
	$(PY) benchmarks/startup.py

corpus: venv
	$(PY) golden/corpus/make_corpus.py

clean:
	rm -rf $(VENV) out .pytest_cache
