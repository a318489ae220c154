"""Output files are never damaged: `-o` and `--in-place` write through to FIFOs, devices and
hard links, follow symlinks, keep modes, refuse read-only targets; bad inputs (NUL bytes,
non-UTF-8, oversized streams) end with a clear error before any output is touched."""

import os
import stat
import subprocess
import sys
import threading

import pytest

from hlo_passes import parse_module, print_module
from hlo_passes.cli import io
from hlo_passes.cli.main import main

GOOD = "HloModule m\n\nENTRY e {\n  p = f32[2] parameter(0)\n  ROOT a = f32[2] negate(p)\n}\n"
BAD = GOOD.replace("negate(p)", "negate(q)")
OLD = "old contents\n"


@pytest.fixture
def src(tmp_path):
    path = tmp_path / "in.hlo"
    path.write_text(GOOD)
    return path


def fmt(*args) -> int:
    return main(["fmt", *map(str, args)])


def test_regular_file_is_replaced_keeping_its_mode(src, tmp_path):
    out = tmp_path / "out.hlo"
    out.write_text(OLD)
    out.chmod(0o640)
    assert fmt(src, "-o", out) == 0
    assert "negate(p)" in out.read_text()
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.hlo", "out.hlo"]  # no temporary left


def test_new_file_gets_the_umask_mode(src, tmp_path):
    out = tmp_path / "sub" / "new.hlo"
    assert fmt(src, "-o", out) == 0
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~mask


def test_hard_link_stays_one_inode(src, tmp_path):
    out = tmp_path / "out.hlo"
    out.write_text(OLD)
    other = tmp_path / "other.hlo"
    os.link(out, other)
    inode = out.stat().st_ino
    assert fmt(src, "-o", out) == 0
    assert out.stat().st_ino == inode and out.stat().st_nlink == 2
    assert other.read_text() == out.read_text() != OLD


def test_symlink_stays_a_link_and_its_target_is_written(src, tmp_path):
    real = tmp_path / "real.hlo"
    real.write_text(OLD)
    link = tmp_path / "link.hlo"
    link.symlink_to(real.name)
    assert fmt(src, "-o", link) == 0
    assert link.is_symlink() and os.readlink(link) == real.name
    assert "negate(p)" in real.read_text()


def test_in_place_through_a_symlink_keeps_the_link(tmp_path):
    real = tmp_path / "real.hlo"
    real.write_text(GOOD.replace("\n\n", "\n\n\n"))
    link = tmp_path / "link.hlo"
    link.symlink_to(real)
    assert fmt("--in-place", link) == 0
    assert link.is_symlink() and real.read_text() == print_module(parse_module(GOOD))


def test_dangling_symlink_is_refused(src, tmp_path, capsys):
    link = tmp_path / "link.hlo"
    link.symlink_to(tmp_path / "nowhere.hlo")
    assert fmt(src, "-o", link) == 2
    assert "link to nothing" in capsys.readouterr().err
    assert not (tmp_path / "nowhere.hlo").exists() and link.is_symlink()


def test_fifo_is_written_through(src, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()), daemon=True)
    reader.start()
    assert fmt(src, "-o", fifo) == 0
    reader.join(10)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert received and "negate(p)" in received[0]


def test_device_is_written_through_not_replaced(src, tmp_path):
    null = tmp_path / "null"
    try:
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a private /dev/null
    except PermissionError:
        pytest.skip("mknod needs root")
    assert fmt(src, "-o", null) == 0
    assert stat.S_ISCHR(os.lstat(null).st_mode)
    assert sorted(tmp_path.iterdir()) == sorted([null, src])


def test_read_only_file_is_refused_even_for_root(src, tmp_path, capsys):
    out = tmp_path / "out.hlo"
    out.write_text(OLD)
    out.chmod(0o444)
    assert fmt(src, "-o", out) == 2
    assert "read-only" in capsys.readouterr().err
    assert out.read_text() == OLD and stat.S_IMODE(out.stat().st_mode) == 0o444


def test_in_place_on_read_only_input_is_refused(tmp_path):
    path = tmp_path / "in.hlo"
    path.write_text(GOOD)
    path.chmod(0o444)
    assert fmt("--in-place", path) == 2
    assert path.read_text() == GOOD


def test_directory_and_empty_name_are_refused(src, tmp_path, capsys):
    assert fmt(src, "-o", tmp_path) == 2
    assert "is a directory" in capsys.readouterr().err
    assert fmt(src, "-o", "") == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "empty" in captured.err


def test_failed_parse_leaves_every_kind_of_target_alone(tmp_path):
    bad = tmp_path / "bad.hlo"
    bad.write_text(BAD)
    out = tmp_path / "out.hlo"
    out.write_text(OLD)
    link = tmp_path / "link.hlo"
    link.symlink_to(out)
    for target in (out, link):
        assert fmt(bad, "-o", target) == 2
    assert out.read_text() == OLD and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.hlo", "link.hlo", "out.hlo"]


def test_run_output_rules_are_the_same(src, tmp_path, capsys):
    out = tmp_path / "out.hlo"
    out.write_text(OLD)
    out.chmod(0o444)
    assert main(["run", str(src), "--passes=dce", "-o", str(out)]) == 2
    assert out.read_text() == OLD
    assert main(["run", str(src), "--passes=dce", "-o", ""]) == 2
    assert capsys.readouterr().out == ""


def test_run_streams_its_output_by_the_same_rules(src, tmp_path, capsys, monkeypatch):
    """`run` prints the module straight into the output (no whole text in memory): the bytes
    are print_module's for a new file, a replaced one (its mode kept), a hard link, a symlink's
    target and stdout; a printer that fails midway leaves every target as it was."""
    expected = print_module(parse_module(GOOD))
    new, old, linked, other, link = (tmp_path / n for n in ("new.hlo", "old.hlo", "a.hlo", "b.hlo", "link.hlo"))
    old.write_text(OLD)
    old.chmod(0o640)
    linked.write_text(OLD)
    os.link(linked, other)
    link.symlink_to(old.name)
    for target in (new, old, other, link):
        assert main(["run", str(src), "--passes=dce", "-q", "-o", str(target)]) == 0
    assert new.read_text() == old.read_text() == linked.read_text() == expected
    assert stat.S_IMODE(old.stat().st_mode) == 0o640 and link.is_symlink() and linked.stat().st_nlink == 2
    capsys.readouterr()
    assert main(["run", str(src), "--passes=dce", "-q"]) == 0
    assert capsys.readouterr().out == expected

    from hlo_passes import printer

    def broken(self, instr):
        raise RuntimeError("printer broke")

    monkeypatch.setattr(printer._Printer, "instruction", broken)
    for target in (tmp_path / "fresh.hlo", old, other):
        before = target.read_text() if target.exists() else None
        assert main(["run", str(src), "--passes=dce", "-q", "-o", str(target)]) != 0
        assert "printer broke" in capsys.readouterr().err
        assert (target.read_text() if target.exists() else None) == before
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


# ----------------------------------------------------------------- inputs --
def test_dev_zero_ends_at_the_first_nul(capsys):
    assert fmt("/dev/zero") == 2
    assert "byte 0 is NUL" in capsys.readouterr().err


def test_binary_input_is_not_text(tmp_path, capsys):
    path = tmp_path / "x.hlo"
    path.write_bytes(GOOD.encode() + b"\xff\xfe")
    assert fmt(path) == 2
    assert f"byte {len(GOOD)} is not UTF-8" in capsys.readouterr().err


def test_oversized_input_stops_at_the_limit(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(io, "MAX_INPUT_BYTES", 1000)
    path = tmp_path / "big.hlo"
    path.write_text(GOOD + "// padding\n" * 200)
    assert fmt(path) == 2
    assert "larger than" in capsys.readouterr().err


def test_endless_stdin_is_bounded():
    """`yes | hlo-passes fmt -`, with the limit lowered through the module for the test."""
    code = ("import sys; from hlo_passes.cli import io; io.MAX_INPUT_BYTES = 1 << 20; "
            "from hlo_passes.cli.main import main; sys.exit(main(['fmt', '-']))")
    yes = subprocess.Popen(["yes"], stdout=subprocess.PIPE)
    try:
        done = subprocess.run([sys.executable, "-c", code], stdin=yes.stdout, capture_output=True, text=True,
                              timeout=60)
    finally:
        yes.kill()
        yes.wait()
    assert done.returncode == 2 and "larger than the 1 MiB" in done.stderr
