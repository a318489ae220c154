"""`hlo-passes run` and `hlo-passes passes`: output, dumps, stats, remarks, verification,
stdin, XLA dump directories, and nothing written unless the command succeeds.

Most tests call the CLI's main() in-process (fast, and test passes can be registered);
one runs the real entry point in a subprocess end to end."""

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hlo_passes import parse_module
from hlo_passes.cli.main import main as cli
from hlo_passes.passes import registry
from tests.frontend.xla_oracle import xla_canonical
from tests.test_pipeline import BreakShape, NegateRoot

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "dp_mlp_step.hlo"

DEAD = """HloModule dead
ENTRY e {
  p = f32[4] parameter(0)
  unused = f32[4] exponential(p)
  a = f32[4] add(p, p)
  b = f32[4] add(p, p)
  ROOT r = f32[4] multiply(a, b)
}
"""


@pytest.fixture
def test_passes(monkeypatch):
    for cls in (NegateRoot, BreakShape):
        monkeypatch.setitem(registry._REGISTRY, cls.name, cls)


@pytest.fixture
def dead(tmp_path):
    path = tmp_path / "dead.hlo"
    path.write_text(DEAD)
    return path


def test_end_to_end_dumps_stats_remarks_and_verification(tmp_path):
    out, dumps = tmp_path / "out.hlo", tmp_path / "dumps"
    r = subprocess.run([sys.executable, "-m", "hlo_passes", "run", str(EXAMPLE), "--passes=collective-fusion,dce",
                        "--stats", "--remarks", "--verify", "--verify-each", "--dump-dir", str(dumps),
                        "-o", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    assert "all-reduce: 6 ops, 27,688 bytes" in r.stderr and "all-reduce: 1 op, 27,688 bytes" in r.stderr  # before / after
    assert "all-reduce-combiner: applied: " in r.stderr  # a remark of the sub-pass that did it
    assert "EQUIVALENT" in r.stderr
    assert "[1/2]" not in r.stderr  # progress only on a terminal
    names = sorted(p.name for p in dumps.iterdir())
    assert names == [f"module_0000.jit__fun.{i:04d}.{p}.{kind}"
                     for i, p in ((0, "collective-fusion"), (1, "dce"))
                     for kind in ("after.txt", "before.txt", "diff")]
    assert "-  %psum" in (dumps / names[2]).read_text()
    assert (dumps / names[0]).read_text() == (dumps / names[4]).read_text()  # after pass 0 = before pass 1
    assert (dumps / names[3]).read_text() == out.read_text()
    xla_canonical(out.read_text())


def test_stdout_when_no_output_file_and_stats_by_opcode(dead, capsys):
    assert cli(["run", str(dead), "--passes=cse,dce", "--stats"]) == 0
    captured = capsys.readouterr()
    module = parse_module(captured.out)
    assert [i.name for i in module.entry.instructions] == ["p", "a", "r"]
    assert "instructions: 5" in captured.err and "instructions: 3" in captured.err
    assert "add 2" in captured.err and "add 1" in captured.err
    assert "cse" in captured.err and "changed" in captured.err


def test_reads_standard_input_once(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO(DEAD))
    assert cli(["run", "-", "--passes=dce"]) == 0
    assert "unused" not in capsys.readouterr().out


def test_bad_pipeline_is_rejected_before_reading_or_writing(tmp_path, capsys):
    out = tmp_path / "out.hlo"
    assert cli(["run", str(tmp_path / "missing.hlo"), "--passes=dce,nope", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "unknown pass 'nope'" in err and "known passes: " in err and "Traceback" not in err
    assert not out.exists()


def test_num_partitions_sets_the_option_or_warns(dead, capsys):
    assert cli(["run", str(dead), "--passes=dce", "--num-partitions", "4"]) == 0
    assert "--num-partitions 4 is ignored: no pass in dce has a num-partitions option" in capsys.readouterr().err
    assert cli(["run", str(dead), "--passes=dce", "--num-partitions", "0"]) == 2


JAX_LOWERED = """HloModule jit_f, entry_computation_layout={(f32[16,8]{1,0})->f32[16,8]{1,0}}

ENTRY main {
  x = f32[16,8]{1,0} parameter(0), sharding={devices=[8,1]<=[8]}
  ROOT t = f32[16,8]{1,0} tanh(x)
}
"""


def test_spmd_partition_of_a_module_without_num_partitions_uses_its_annotations(tmp_path, capsys):
    """JAX's lowered text records no num_partitions: partitioned for the 8 devices its
    annotations name (it came back unchanged, with a remark only `--remarks` showed)."""
    src = tmp_path / "lowered.hlo"
    src.write_text(JAX_LOWERED)
    assert cli(["run", str(src), "--passes=spmd-partition", "--remarks"]) == 0
    captured = capsys.readouterr()
    module = parse_module(captured.out)
    assert module.num_partitions == 8
    (tanh,) = [i for i in module.entry.instructions if i.opcode.value == "tanh"]
    assert tanh.array_shape.dims == (2, 8)
    assert "partitioned for the 8 devices its annotations name" in captured.err


def test_verify_each_failure_names_the_pass_and_writes_nothing(test_passes, dead, tmp_path, capsys):
    out, dumps = tmp_path / "out.hlo", tmp_path / "dumps"
    assert cli(["run", str(dead), "--passes=dce,break-shape,cse", "--verify-each", "--dump-dir", str(dumps),
                "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: pass break-shape: the structural verifier rejects its output:")
    assert "e/%r: shape should be f32[4] (from its operands), got f32[5]" in err
    assert "  > ROOT r = f32[5] multiply(a, b)" in err and f"its output is in {dumps}" in err
    assert not out.exists()
    assert (dumps / "module_0000.dead.0001.break-shape.after.txt").exists()
    assert not list(dumps.glob("*.0002.cse.*"))


def test_malformed_input_is_a_usage_error_under_verify_each(tmp_path, capsys):
    bad = tmp_path / "bad.hlo"
    # the parser checks what XLA's parser checks; a channel shared by a send and an all-reduce
    # is a module-level check of the verifier (XLA's VerifyChannels)
    bad.write_text("""HloModule m
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY e {
  p = f32[4] parameter(0)
  t = token[] after-all()
  s = (f32[4], u32[], token[]) send(p, t), channel_id=5
  sd = token[] send-done(s), channel_id=5
  ROOT r = f32[4] all-reduce(p), channel_id=5, replica_groups={}, to_apply=add
}
""")
    assert cli(["run", str(bad), "--passes=dce", "--verify-each"]) == 2
    err = capsys.readouterr().err
    assert f"error: {bad}: the input module is malformed (before any pass ran):" in err
    assert "e/%r: channel_id=5 is also used by send s" in err


def test_verify_mismatch_exits_1_and_writes_nothing(test_passes, dead, tmp_path, capsys):
    out = tmp_path / "out.hlo"
    assert cli(["run", str(dead), "--passes=negate-root", "--verify", "-o", str(out)]) == 1
    assert "MISMATCH" in capsys.readouterr().err.upper()
    assert not out.exists()
    assert cli(["run", str(dead), "--passes=cse,dce", "--verify", "-o", str(out)]) == 0
    assert out.exists()


def test_verify_runs_on_the_platform_asked_for(dead, tmp_path, capsys):
    """`--platform` reaches the runtime: the CPU verifies; a platform this machine lacks is a
    plain error (exit 2, no output written), not an internal one."""
    out = tmp_path / "out.hlo"
    assert cli(["run", str(dead), "--passes=cse,dce", "--verify", "--platform", "cpu", "-o", str(out)]) == 0
    assert "EQUIVALENT" in capsys.readouterr().err and out.exists()
    out.unlink()
    assert cli(["run", str(dead), "--passes=cse,dce", "--verify", "--platform", "tpu", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --verify: no tpu backend") and "internal error" not in err
    assert not out.exists()


def test_xla_dump_directories(tmp_path, capsys):
    dump = tmp_path / "xla_dump"
    dump.mkdir()
    (dump / "module_0007.jit_step.before_optimizations.txt").write_text(EXAMPLE.read_text())
    (dump / "module_0007.jit_step.cpu_after_optimizations.txt").write_text("not used")
    (dump / "module_0003.jit_other.before_optimizations.txt").write_text(DEAD)
    assert cli(["run", str(dump), "--passes=dce"]) == 2
    assert "holds 2 modules; pick one with --module (0003 jit_other, 0007 jit_step)" in capsys.readouterr().err
    assert cli(["run", str(dump), "--module", "jit_step", "--passes=dce"]) == 0
    captured = capsys.readouterr()
    assert "reading " in captured.err and "module_0007.jit_step.before_optimizations.txt" in captured.err
    assert captured.out.startswith("HloModule jit__fun")
    assert cli(["run", str(dump), "--module", "3", "--passes=dce", "--dump-dir", str(tmp_path / "d")]) == 0
    assert capsys.readouterr().out.startswith("HloModule dead")
    assert (tmp_path / "d" / "module_0003.dead.0000.dce.after.txt").exists()  # keeps XLA's number
    assert cli(["run", str(dump), "--module", "9", "--passes=dce"]) == 2
    assert cli(["run", str(tmp_path), "--passes=dce"]) == 2
    assert "is it an XLA dump directory?" in capsys.readouterr().err


def test_passes_lists_every_pass_with_typed_options(capsys):
    assert cli(["passes"]) == 0
    out = capsys.readouterr().out
    for name in registry.all_passes():
        assert f"{name}\n    " in out
    assert re.search(r"\n    remove-dead-computations: bool = true {4,}also drop computations nobody calls\n", out)
    assert "propagate-to-parameters: bool or none = none" in out
    assert cli(["passes", "cse"]) == 0
    assert capsys.readouterr().out.startswith("cse\n")
    assert cli(["passes", "nope"]) == 2


def test_unwritable_output_and_binary_input_are_usage_errors(dead, tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert cli(["run", str(dead), "--passes=dce", "-o", str(blocker / "out.hlo")]) == 2
    err = capsys.readouterr().err
    assert f"error: {blocker / 'out.hlo'}: cannot write it" in err and "Traceback" not in err
    assert cli(["run", str(dead), "--passes=dce", "--dump-dir", str(blocker / "dumps")]) == 2
    assert "error: " in capsys.readouterr().err
    binary = tmp_path / "module.pb"
    binary.write_bytes(b"\x08\x96\x01\xff\xfe")
    assert cli(["run", str(binary), "--passes=dce"]) == 2
    assert "module.pb: not a serialized HLO module" in capsys.readouterr().err


def test_output_file_gets_the_usual_mode(dead, tmp_path):
    import os

    out = tmp_path / "out.hlo"
    assert cli(["run", str(dead), "--passes=dce", "-o", str(out)]) == 0
    mask = os.umask(0)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~mask


def _run_on_a_terminal(args, env_extra):
    """Run the CLI with its stderr on a pseudo-terminal; what the terminal shows."""
    import os
    import pty

    env = {**os.environ, **env_extra}
    main_fd, child_fd = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "hlo_passes", *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=child_fd, cwd=ROOT, env=env)
    os.close(child_fd)
    shown = b""
    while True:
        try:
            chunk = os.read(main_fd, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    proc.wait(timeout=120)
    os.close(main_fd)
    return proc.returncode, shown.decode()


def test_progress_line_on_a_terminal_only(tmp_path):
    """A pass running past the threshold gets a ticking line and a final one with its time on a
    terminal; --quiet removes it; a pipe never gets it (the end-to-end test above)."""
    args = ["run", str(EXAMPLE), "--passes=collective-fusion,dce", "-o", str(tmp_path / "out.hlo")]
    code, shown = _run_on_a_terminal(args, {"HLO_PASSES_PROGRESS_AFTER": "0"})
    assert code == 0, shown
    assert "[1/2] collective-fusion" in shown and "[2/2] dce" in shown
    assert "\r\x1b[K[1/2] collective-fusion" in shown and " s\n" in shown.replace("\r\n", "\n")
    code, shown = _run_on_a_terminal([*args, "--quiet"], {"HLO_PASSES_PROGRESS_AFTER": "0"})
    assert code == 0 and "[1/2]" not in shown, shown


def test_stats_report_each_pass_time_and_peak_memory(dead, capsys):
    assert cli(["run", str(dead), "--passes=cse,dce", "--stats"]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip().startswith(("cse", "dce"))]
    assert len(lines) == 2, err
    for line in lines:
        assert " ms  cpu " in line and " MiB" in line
        peak = float(line.split("peak")[1].split("MiB")[0])
        assert 10 < peak < 100_000  # a Python process with the parser loaded: tens of MiB at least


def test_final_module_is_always_checked_and_a_malformed_one_never_written(test_passes, dead, tmp_path, capsys):
    """Without --verify-each the final module still goes through the structural verifier: a
    pass that leaves a malformed module (and says it changed nothing) gets exit code 1 and no
    output, to a file or to stdout."""
    out = tmp_path / "out.hlo"
    assert cli(["run", str(dead), "--passes=dce,break-shape", "-o", str(out)]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith("error: the final module is malformed (structural verifier), nothing written:")
    assert "e/%r: shape should be f32[4] (from its operands), got f32[5]" in captured.err
    assert "--verify-each" in captured.err
    assert not out.exists()
    assert cli(["run", str(dead), "--passes=break-shape"]) == 1
    assert capsys.readouterr().out == ""
    assert cli(["run", str(dead), "--passes=dce", "-o", str(out)]) == 0 and out.exists()


def test_gpu_dump_stage_names(tmp_path):
    # XLA:GPU prefixes the optimized module with the chip (seen on an H100 with jax 0.11.2:
    # `sm_9.0a_gpu_after_optimizations`, a dot inside); its buffer reports share the prefix.
    from hlo_passes.dump_dir import DumpDirectory

    dump = tmp_path / "gpu_dump"
    dump.mkdir()
    (dump / "module_5967.jit_step.before_optimizations.txt").write_text(EXAMPLE.read_text())
    (dump / "module_5967.jit_step.sm_9.0a_gpu_after_optimizations.txt").write_text(EXAMPLE.read_text())
    (dump / "module_5967.jit_step.sm_9.0a_gpu_after_optimizations-buffer-assignment.txt").write_text("x")
    (dump / "module_0012.jit_f.gfx942_gpu_after_optimizations.txt").write_text(DEAD)
    modules = {m.name: m for m in DumpDirectory(dump).modules()}
    assert sorted(modules) == ["jit_f", "jit_step"]
    assert [st.stage for st in modules["jit_step"].stages] == ["before_optimizations", "after_optimizations"]
    found = DumpDirectory(dump).find("jit_step", "after_optimizations")
    assert found.path.name == "module_5967.jit_step.sm_9.0a_gpu_after_optimizations.txt"
    assert DumpDirectory(dump).find("jit_f", "after_optimizations").path.name.startswith("module_0012.jit_f.gfx942")


def test_python_dash_m_reports_bad_input_as_such(tmp_path):
    # Run as `python -m hlo_passes.cli.main` the file is `__main__`: its except clauses must still
    # catch the errors the commands raise (a missing stage was reported as an internal error).
    import subprocess
    import sys

    dump = tmp_path / "only_before"
    dump.mkdir()
    (dump / "module_0001.jit_f.before_optimizations.txt").write_text(EXAMPLE.read_text())
    for launcher in (["-m", "hlo_passes.cli.main"], ["-m", "hlo_passes"]):
        done = subprocess.run([sys.executable, *launcher, "verify", str(dump)], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 2, done.stderr
        assert "internal error" not in done.stderr
        assert "no stage 'after_optimizations'" in done.stderr


def test_verify_reports_what_xla_cannot_run_as_such(tmp_path, capsys):
    """The variadic reduce-scatter form is XLA's, but XLA:CPU does not run it: `--verify`
    says XLA could not run the module (exit 2, nothing written), not an internal error."""
    src, out = tmp_path / "rs.hlo", tmp_path / "out.hlo"
    src.write_text("""HloModule rs, num_partitions=8

add { a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b) }

ENTRY e {
  p = f32[16,8] parameter(0)
  q = f32[8,16] parameter(1)
  a = f32[2,8] reduce-scatter(p), channel_id=1, replica_groups=[1,8]<=[8], use_global_device_ids=true, dimensions={0}, to_apply=add
  b = f32[8,2] reduce-scatter(q), channel_id=2, replica_groups=[1,8]<=[8], use_global_device_ids=true, dimensions={1}, to_apply=add
  ROOT t = (f32[2,8], f32[8,2]) tuple(a, b)
}
""")
    rc = cli(["run", str(src), "--passes", "reduce-scatter-combiner{form=variadic,combine-by-dim=false}", "--verify",
              "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("error: --verify: XLA could not compile or run a module") and "internal error" not in err
    assert not out.exists()
