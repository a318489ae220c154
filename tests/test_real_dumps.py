"""The dump workflow as users run it: JAX programs executed with `XLA_FLAGS=--xla_dump_to=DIR`
(both lowerings), and every command run on the files XLA wrote — no hand-written headers.

The dump directories are made once per session by tests/dumps/programs.py in a subprocess
(XLA reads XLA_FLAGS when it starts).  Each command runs as the installed CLI does, in a
subprocess: exit codes, stderr and the device count chosen before JAX starts are part of what
is tested.  The checks are the survey's (tests/dumps/survey.py), which also runs standalone
on any dump directory.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hlo_passes.dump_dir import DumpDirectory, DumpError
from hlo_passes.ir.program_kind import ProgramKind, read_program
from hlo_passes.parse.module_parser import parse_module
from tests.dumps.programs import PROGRAMS
from tests.dumps.survey import checks_for, corrupt, run

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS_SCRIPT = ROOT / "tests" / "dumps" / "programs.py"
EIGHT = [p.name for p in PROGRAMS.values() if p.devices == 8]


def make_dump(directory: Path, *, lowering: str = "shardy", devices: int = 8, only: list[str] | None = None,
              flags: str = "--xla_dump_hlo_pass_re=spmd-partitioning") -> Path:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices} --xla_dump_to={directory} {flags}"
    argv = [sys.executable, str(PROGRAMS_SCRIPT), "--lowering", lowering] + (["--only", *only] if only else [])
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return directory


@pytest.fixture(scope="session")
def dumps(tmp_path_factory) -> dict[str, Path]:
    """One dump directory per JAX lowering, every 8-device program in each."""
    base = tmp_path_factory.mktemp("xla_dumps")
    return {lowering: make_dump(base / lowering, lowering=lowering) for lowering in ("shardy", "gspmd")}


def cli(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return subprocess.run([sys.executable, "-m", "hlo_passes", *argv], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=timeout)


@pytest.mark.parametrize("lowering", ["shardy", "gspmd"])
@pytest.mark.parametrize("program", EIGHT)
def test_every_command_on_every_stage_of_a_real_dump(dumps, lowering, program, tmp_path):
    """fmt, run --verify (spmd-partition and the full pipeline, from the file and from the
    directory), exec, verify of XLA's own partition, a corrupted partition rejected with exit 1,
    and collective-fusion on XLA's optimized module: expected exit code, never a traceback."""
    checks = checks_for(dumps[lowering], program, tmp_path)
    assert {c.name for c in checks} >= {"fmt", "run", "pipeline", "dir", "exec", "xla-partition", "corrupted",
                                        "optimized"}
    failed = [c for c in map(run, checks) if not c.ok]
    assert not failed, "\n\n".join(f"{c.name}: exit {c.rc} (want {c.want})\n{c.stderr[-2500:]}" for c in failed)


def test_stages_are_read_as_the_programs_they_are(dumps):
    """before_optimizations and every pass dump before spmd-partitioning are global programs
    (whatever num_partitions says); after_spmd-partitioning and after_optimizations are
    per-device programs on 8 devices."""
    for lowering, directory in dumps.items():
        dump = DumpDirectory(directory)
        for name in ("megatron_mlp", "shard_map_psums", "pmap_step", "uneven"):
            module = dump.module(PROGRAMS[name].module)
            kinds = {}
            for stage in module.stages:
                reading = read_program(parse_module(stage.read_text()))
                kinds[stage.after_pass or stage.stage] = (reading.kind, reading.num_devices)
            assert kinds["before_optimizations"] == (ProgramKind.GLOBAL, 8), (lowering, name, kinds)
            assert kinds["spmd-partitioning"] == (ProgramKind.PER_DEVICE, 8), (lowering, name, kinds)
            assert kinds["after_optimizations"] == (ProgramKind.PER_DEVICE, 8), (lowering, name, kinds)


def test_list_shows_modules_stages_and_kinds(dumps):
    listing = cli("list", str(dumps["shardy"]))
    assert listing.returncode == 0, listing.stderr
    line = next(line for line in listing.stdout.splitlines() if "jit_megatron_mlp" in line)
    assert "global, 8 devices" in line
    stages = cli("list", str(dumps["shardy"]), "--module", "jit_megatron_mlp")
    assert stages.returncode == 0, stages.stderr
    assert "before_optimizations" in stages.stdout and "after_optimizations" in stages.stdout
    spmd = next(line for line in stages.stdout.splitlines() if "after_spmd-partitioning" in line)
    assert "per-device, 8 devices" in spmd
    missing = cli("list", str(dumps["shardy"]), "--module", "jit_nothing")
    assert missing.returncode == 2 and "no module named or numbered 'jit_nothing'" in missing.stderr


def test_verify_two_stages_of_one_module(dumps):
    """One directory and --stage A,B (default: before_optimizations vs after_optimizations)."""
    d = str(dumps["gspmd"])
    done = cli("verify", d, "--module", "jit_attention_grad")
    assert done.returncode == 0, done.stderr
    assert "ORIGINAL: global program on 8 devices" in done.stdout
    assert "REWRITTEN: per-device program on 8 devices" in done.stdout
    done = cli("verify", d, "--module", "jit_attention_grad", "--stage", "before_optimizations,spmd-partitioning")
    assert done.returncode == 0, done.stderr
    same = cli("diff", d, "--module", "jit_attention_grad", "--stage", "before_optimizations,before_optimizations")
    assert same.returncode == 0, same.stdout + same.stderr
    bad = cli("verify", d, "--module", "jit_attention_grad", "--stage", "nonesuch")
    assert bad.returncode == 2 and "no stage 'nonesuch'" in bad.stderr


def test_as_overrides_the_reading(dumps, tmp_path):
    """`--as`: XLA's partition read as a global program is a different (wrong) program: verify
    says so instead of guessing."""
    stage = DumpDirectory(dumps["shardy"]).find("jit_megatron_mlp", "spmd-partitioning")
    before = DumpDirectory(dumps["shardy"]).find("jit_megatron_mlp")
    done = cli("verify", str(before.path), str(stage.path), "--as", "global,global")
    assert done.returncode in (1, 2) and "Traceback" not in done.stderr
    done = cli("verify", str(before.path), str(stage.path), "--as", "global,per-device")
    assert done.returncode == 0, done.stderr
    bad = cli("verify", str(before.path), str(stage.path), "--as", "sideways")
    assert bad.returncode == 2 and "--as: expected" in bad.stderr


def test_exec_of_a_per_device_program_summarises_every_device(dumps):
    stage = DumpDirectory(dumps["gspmd"]).find("jit_dp_momentum", "spmd-partitioning")
    done = cli("exec", str(stage.path))
    assert done.returncode == 0, done.stderr
    assert "per-device program on 8 devices" in done.stderr
    assert "on each of 8 devices" in done.stdout


def test_binary_proto_dumps(tmp_path):
    """--xla_dump_hlo_as_proto: XLA's HloProto files read through jaxlib, as input and in a listing."""
    d = make_dump(tmp_path / "proto", only=["megatron_mlp"],
                  flags="--xla_dump_hlo_as_proto --xla_dump_hlo_pass_re=spmd-partitioning")
    assert not list(d.glob("*.jit_megatron_mlp.before_optimizations.txt"))
    pb = next(d.glob("*.jit_megatron_mlp.before_optimizations.hlo.pb"))
    fmt = cli("fmt", str(pb))
    assert fmt.returncode == 0, fmt.stderr
    assert fmt.stdout.startswith("HloModule jit_megatron_mlp")
    done = cli("verify", str(d), "--module", "jit_megatron_mlp", "--stage", "before_optimizations,spmd-partitioning")
    assert done.returncode == 0, done.stderr
    junk = tmp_path / "junk.pb"
    junk.write_bytes(b"\x0a\x05hello\x12")
    bad = cli("fmt", str(junk))
    assert bad.returncode == 2 and "not a serialized HLO module" in bad.stderr and "Traceback" not in bad.stderr


def test_dump_directory_errors_name_what_is_there(tmp_path):
    with pytest.raises(DumpError, match="is it an XLA dump directory"):
        DumpDirectory(tmp_path).module(None)


# ------------------------------------------------------------ past 8 devices --
def test_64_device_module_verifies_in_one_process(tmp_path):
    """The virtual device count follows the module (64), set before XLA starts."""
    d = make_dump(tmp_path / "d64", devices=64, only=["matmul_64"])
    stage = DumpDirectory(d).find("jit_matmul_64", "spmd-partitioning")
    done = cli("verify", str(d), "--module", "jit_matmul_64", "--stage", "before_optimizations,spmd-partitioning")
    assert done.returncode == 0, done.stderr
    assert "partitioned on 64 devices" in done.stdout
    bad = tmp_path / "bad.hlo"
    bad.write_text(corrupt(stage.read_text()))
    done = cli("verify", str(DumpDirectory(d).find("jit_matmul_64").path), str(bad))
    assert done.returncode == 1, done.stdout + done.stderr


@pytest.mark.parametrize("devices,program", [(8, "megatron_mlp"), (16, "megatron_16")])
def test_verify_across_two_processes(tmp_path, devices, program):
    """`verify --processes 2`: two JAX processes joined by jax.distributed (CPU collectives over
    gloo), each with half the devices; XLA's own partition verifies, a corrupted one exits 1."""
    d = make_dump(tmp_path / "d", devices=devices, only=[program])
    module = PROGRAMS[program].module
    dump = DumpDirectory(d)
    before, after = dump.find(module), dump.find(module, "spmd-partitioning")
    done = cli("verify", str(before.path), str(after.path), "--processes", "2", "--timeout", "240")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"ran on 2 processes joined by jax.distributed, {devices // 2} devices each" in done.stdout
    assert "[Gloo]" not in done.stdout + done.stderr
    bad = tmp_path / "bad.hlo"
    bad.write_text(corrupt(after.read_text()))
    done = cli("verify", str(before.path), str(bad), "--processes", "2", "--timeout", "240")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "MISMATCH" in done.stdout
    uneven = cli("verify", str(before.path), str(after.path), "--processes", "3")
    assert uneven.returncode == 2 and "do not split evenly over 3 processes" in uneven.stderr
