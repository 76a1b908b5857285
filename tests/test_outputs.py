"""Writes that cannot half-happen (issue 23, item 3): output paths are checked before the
work, and files are written to a temporary name and renamed, so a full disk or a failure
leaves the old file (or none) and no partial one. The full disk is a real one: a 64 KiB
tmpfs, mounted when this runs as root (skipped otherwise)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from parsim.specs import SpecError
from parsim.specs.files import check_output_dir, check_output_path, output_file, write_text


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 64 KiB filesystem (tmpfs), or a skip where mounting is not allowed."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def test_a_directory_a_path_under_a_file_and_an_empty_path_are_refused(tmp_path):
    (tmp_path / "afile").write_text("x")
    for path, fragment in ((tmp_path, "not a directory"), (tmp_path / "afile" / "x.json", "is a file"),
                           (tmp_path / "afile" / "deeper" / "x.json", "is a file"), ("", "a file path")):
        with pytest.raises(SpecError) as err:
            check_output_path(path, "out")
        assert err.value.field == "out" and fragment in str(err.value)
    with pytest.raises(SpecError):
        check_output_dir(tmp_path / "afile", "out")
    assert check_output_path(tmp_path / "new" / "dirs" / "x.json") == tmp_path / "new" / "dirs" / "x.json"
    assert not (tmp_path / "new").exists()          # checking creates nothing


def test_a_read_only_directory_is_refused_before_writing(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:
        made = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)], capture_output=True)
        if made.returncode != 0:
            pytest.skip("root ignores permissions and cannot mount a read-only tmpfs here")
    else:
        ro.chmod(0o555)
    try:
        with pytest.raises(SpecError) as err:
            check_output_path(ro / "x.json", "trace")
        assert err.value.field == "trace" and "writable" in str(err.value)
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(ro)], check=False)
        else:
            ro.chmod(0o755)


def test_a_failure_while_writing_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "t.json"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with output_file(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("the writer failed")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]


def test_a_full_disk_is_one_spec_error_and_leaves_no_partial_file(tiny_disk):
    (tiny_disk / "keep.txt").write_text("old")
    with pytest.raises(SpecError) as err:
        write_text(tiny_disk / "keep.txt", "x" * 200_000, "out")
    assert "No space left on device" in str(err.value) and "nothing was written" in str(err.value)
    assert (tiny_disk / "keep.txt").read_text() == "old"
    assert sorted(p.name for p in tiny_disk.iterdir()) == ["keep.txt"]
    with pytest.raises(SpecError):
        write_text(tiny_disk / "new.txt", "x" * 200_000)
    assert sorted(p.name for p in tiny_disk.iterdir()) == ["keep.txt"]


def test_simulate_trace_on_a_full_disk_exits_2_with_one_line_and_no_file(tiny_disk):
    proc = subprocess.run([sys.executable, "-m", "parsim", "simulate", "--model", "gpt3-1.3b", "--cluster",
                           "a100-80g:8", "--plan", "pp=8 gbs=64", "--trace", str(tiny_disk / "t.json")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "No space left on device" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert list(tiny_disk.iterdir()) == []


def test_validation_tables_grow_by_whole_rows(tmp_path):
    from parsim.study.validate.matrix import COLUMNS, append_row, read_rows
    row = {c: "" for c in COLUMNS} | {"plan": "dp=2", "model": "tiny", "world_size": 2, "outcome": "did not fit: x"}
    append_row(tmp_path, row)
    append_row(tmp_path, row | {"plan": "dp=2 zero=1"})
    rows = read_rows(tmp_path)
    assert [r["plan"] for r in rows] == ["dp=2", "dp=2 zero=1"]
    assert sorted(p.name for p in Path(tmp_path).iterdir()) == ["validation.csv"]
