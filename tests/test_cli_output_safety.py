"""Outputs never replace what the user pointed at, inputs are never clobbered, and bad
streams or options end with `error: ...`, exit 2, no traceback (README "bad input").

Each test reproduces one defect a probe found: `-o /dev/stdout` replacing the file stdout
was redirected to, `.npz` and HTML outputs written over the input or a read-only file, `run
--dump-dir` writing over inputs, read-only files and into FIFOs, `fmt --in-place FIFO`
hanging, closed stdin/stdout, unchecked --timeout/--seed, and an .npz whose headers declare
gigabytes.  FIFOs and closed descriptors run the CLI in a subprocess with a timeout; the
rest call main() in-process."""

import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from numpy.lib import format as npformat

from hlo_passes.cli.main import main as cli

ROOT = Path(__file__).resolve().parents[1]

SMALL = """HloModule m, entry_computation_layout={(f32[4]{0}, f32[4]{0})->f32[4]{0}}

ENTRY %main (a: f32[4], b: f32[4]) -> f32[4] {
  %a = f32[4]{0} parameter(0)
  %b = f32[4]{0} parameter(1)
  ROOT %add = f32[4]{0} add(f32[4]{0} %a, f32[4]{0} %b)
}
"""
OTHER = SMALL.replace("add(", "multiply(")


def run_cli(*args, shell_redirect: str = "", timeout: float = 60, **kwargs):
    """`hlo-passes ARGS` in a subprocess (bash, for `>&-`-style redirections), bounded in time."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "JAX_LOGGING_LEVEL")}
    words = " ".join(f"'{a}'" for a in [sys.executable, "-m", "hlo_passes", *map(str, args)])
    return subprocess.run(["bash", "-c", f"{words} {shell_redirect}"], text=True, cwd=kwargs.pop("cwd", ROOT),
                          env=env, timeout=timeout, **{"capture_output": True, **kwargs})


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small.hlo"
    path.write_text(SMALL)
    return path


def assert_refused(rc, err, path, before):
    assert rc == 2, err
    assert "error:" in err and "Traceback" not in err
    assert path.read_bytes() == before


# 1. -o /dev/stdout is the open descriptor, not the file behind it


def test_dev_stdout_appends_where_stdout_stands(small, tmp_path):
    log = tmp_path / "log.txt"
    log.write_text("keep\n")
    with open(log, "a") as out:
        r = run_cli("fmt", small, "-o", "/dev/stdout", stdout=out, stderr=subprocess.PIPE, capture_output=False)
    assert r.returncode == 0, r.stderr
    assert log.read_text().startswith("keep\nHloModule m")


def test_dev_stdout_to_a_pipe(small):
    r = run_cli("fmt", small, "-o", "/dev/stdout")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("HloModule m")


# 2. .npz outputs: never over an input or a read-only file


def test_save_outputs_refuses_the_input(small, capsys):
    before = small.read_bytes()
    assert_refused(cli(["exec", str(small), "--save-outputs", str(small)]), capsys.readouterr().err, small, before)


def test_save_outputs_refuses_a_read_only_file(small, tmp_path, capsys):
    ro = tmp_path / "ro.npz"
    ro.write_bytes(b"mine")
    ro.chmod(0o444)
    assert_refused(cli(["exec", str(small), "--save-outputs", str(ro)]), capsys.readouterr().err, ro, b"mine")


def test_save_inputs_refuses_the_input(small, tmp_path, capsys):
    other = tmp_path / "other.hlo"
    other.write_text(SMALL)
    before = small.read_bytes()
    rc = cli(["verify", str(small), str(other), "--save-inputs", str(small)])
    assert_refused(rc, capsys.readouterr().err, small, before)


def test_save_outputs_still_writes_npz(small, tmp_path, capsys):
    out = tmp_path / "out"  # exactly this name: numpy would add .npz
    assert cli(["exec", str(small), "--save-outputs", str(out)]) == 0, capsys.readouterr().err
    assert np.load(out)["arr_0"].shape == (4,)


# 3. HTML outputs: never over an input (whatever the name)


@pytest.mark.parametrize("command", ["run", "diff", "view", "view-symlink", "fmt-stdin"])
def test_html_and_text_outputs_refuse_an_input(command, small, tmp_path, capsys, monkeypatch):
    other = tmp_path / "other.hlo"
    other.write_text(OTHER)
    target = small
    if command == "view-symlink":
        target = tmp_path / "link.html"
        target.symlink_to(small)
    argv = {"run": ["run", str(small), "--passes", "dce", "--report", str(small)],
            "diff": ["diff", str(small), str(other), "--html", str(small)],
            "view": ["view", str(small), "-o", str(small)],
            "view-symlink": ["view", str(small), "-o", str(target)],
            "fmt-stdin": ["fmt", "-", "-o", str(small)]}[command]
    if command == "fmt-stdin":
        monkeypatch.setattr(sys, "stdin", open(small))
    before = small.read_bytes()
    assert_refused(cli(argv), capsys.readouterr().err, small, before)


# 4. run --dump-dir: through the safe writer


def test_dump_dir_refuses_read_only_dump_and_input(small, tmp_path, capsys):
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    ro = dumps / "module_0000.m.0000.dce.diff"
    ro.write_text("mine")
    ro.chmod(0o444)
    assert_refused(cli(["run", str(small), "--passes", "dce", "--dump-dir", str(dumps)]),
                   capsys.readouterr().err, ro, b"mine")
    ro.chmod(0o644)
    ro.unlink()
    inside = dumps / "module_0000.m.0000.dce.before.txt"
    inside.write_text(SMALL.replace("  ROOT", "  // a comment\n  ROOT"))
    before = inside.read_bytes()
    assert_refused(cli(["run", str(inside), "--passes", "dce", "--dump-dir", str(dumps)]),
                   capsys.readouterr().err, inside, before)


def test_dump_dir_writes_before_after_and_diff(small, tmp_path, capsys):
    dumps = tmp_path / "dumps"
    assert cli(["run", str(small), "--passes", "dce", "--dump-dir", str(dumps)]) == 0, capsys.readouterr().err
    assert sorted(p.name.split(".", 3)[-1] for p in dumps.iterdir()) == [
        "dce.after.txt", "dce.before.txt", "dce.diff"]


def test_dump_dir_refuses_a_fifo(small, tmp_path):
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    os.mkfifo(dumps / "module_0000.m.0000.dce.after.txt")
    r = run_cli("run", small, "--passes", "dce", "--dump-dir", dumps, timeout=30)
    assert r.returncode == 2 and "not a regular file" in r.stderr and "Traceback" not in r.stderr


# 5. fmt --in-place needs a regular file


def test_in_place_refuses_a_fifo(tmp_path):
    fifo = tmp_path / "f.hlo"
    os.mkfifo(fifo)
    r = run_cli("fmt", "--in-place", fifo, timeout=30)
    assert r.returncode == 2 and "not a regular file" in r.stderr


def test_in_place_still_rewrites_the_file(small, capsys):
    small.write_text(SMALL.replace("  ROOT", "  // a comment\n  ROOT"))
    assert cli(["fmt", "--in-place", str(small)]) == 0, capsys.readouterr().err
    assert "comment" not in small.read_text()


# 6. closed stdin and stdout


@pytest.mark.parametrize("args, redirect", [
    (["fmt", "{small}"], ">&-"),
    (["run", "{small}", "--passes", "dce"], ">&-"),
    (["diff", "{small}", "{other}"], ">&-"),
    (["passes", "dce"], ">&-"),
    (["exec", "{small}"], ">&-"),
    (["fmt", "-"], "<&-"),
])
def test_closed_standard_streams(args, redirect, small, tmp_path):
    other = tmp_path / "other.hlo"
    other.write_text(OTHER)
    r = run_cli(*[a.format(small=small, other=other) for a in args], shell_redirect=redirect, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "is closed" in r.stderr and "Traceback" not in r.stderr


def test_closed_stdout_does_not_hinder_an_output_file(small, tmp_path):
    out = tmp_path / "out.hlo"
    r = run_cli("fmt", small, "-o", out, shell_redirect=">&-")
    assert r.returncode == 0, r.stderr
    assert out.read_text().startswith("HloModule m")


# 7. verify's options checked up front


@pytest.mark.parametrize("option, value, says", [
    ("--timeout", "inf", "--timeout must be"), ("--timeout", "nan", "--timeout must be"),
    ("--timeout", "1e300", "--timeout must be"),
    ("--seed", "-1", "--seed must be")])
def test_verify_options_checked(option, value, says, small):
    # (a subprocess: unchecked, --timeout nan fired the watchdog's os._exit at once)
    r = run_cli("verify", small, small, option, value, timeout=120)
    assert r.returncode == 2 and says in r.stderr and "XLA" not in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


# 8. an .npz is judged by its headers before any data is loaded


def _npz_declaring(path: Path, shapes: list[tuple[int, ...]]) -> None:
    """An .npz whose arrays' headers declare `shapes` (f32), each holding only zeros (deflated)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for i, shape in enumerate(shapes):
            header = io.BytesIO()
            npformat.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": shape})
            with zf.open(f"arr_{i}.npy", "w", force_zip64=True) as member:
                member.write(header.getvalue())
                left = int(np.prod(shape)) * 4
                while left:
                    member.write(bytes(min(left, 1 << 20)))
                    left -= min(left, 1 << 20)


def test_npz_headers_checked_before_loading(small, tmp_path, capsys, monkeypatch):
    bomb = tmp_path / "bomb.npz"
    _npz_declaring(bomb, [(4,), (8 << 20,)])  # 32 MiB declared for b: f32[4]

    def no_load(*args, **kwargs):
        raise AssertionError("np.load called before the headers were checked")

    import hlo_passes.runtime.inputs as inputs

    monkeypatch.setattr(inputs.np, "load", no_load)
    rc = cli(["exec", str(small), "--inputs", str(bomb)])
    err = capsys.readouterr().err
    assert rc == 2 and "input for parameter b: shape [8388608], expected f32[4]" in err, err


def test_npz_member_count_checked_before_loading(small, tmp_path, capsys, monkeypatch):
    bomb = tmp_path / "bomb.npz"
    _npz_declaring(bomb, [(8 << 20,)])
    import hlo_passes.runtime.inputs as inputs

    monkeypatch.setattr(inputs.np, "load", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    rc = cli(["verify", str(small), str(small), "--inputs", str(bomb)])
    err = capsys.readouterr().err
    assert rc == 2 and "1 input arrays for 2 parameter leaves" in err, err


def test_npz_inputs_still_load(small, tmp_path, capsys):
    good = tmp_path / "in.npz"
    np.savez(good, np.ones(4, np.float32), np.full(4, 2, np.float32))
    assert cli(["exec", str(small), "--inputs", str(good)]) == 0, capsys.readouterr().err
    assert "min 3 max 3" in capsys.readouterr().out


def test_commands_run_under_the_supervisor_write_to_a_named_descriptor(small, tmp_path):
    """`exec` and `verify` run XLA in a supervised child; the child must hold the descriptors
    the arguments name (`--save-outputs /dev/fd/3` was 'Bad file descriptor': a child gets only
    the standard three).  A descriptor that is not open stays a clear error."""
    import numpy as np

    saved = tmp_path / "outputs.npz"
    r = run_cli("exec", small, "--save-outputs", "/dev/fd/3", shell_redirect=f"3>'{saved}'", timeout=120)
    assert r.returncode == 0, r.stderr
    with np.load(saved) as outputs:
        assert list(outputs) == ["arr_0"]
    r = run_cli("exec", small, "--save-outputs", "/dev/fd/7", timeout=120)
    assert r.returncode == 2 and "descriptor 7" in r.stderr and "Traceback" not in r.stderr, r.stderr
