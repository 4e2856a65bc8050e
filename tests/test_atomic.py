"""atomic.publishing: a folder or file appears whole or not at all, an overwrite keeps the old artefact until
the new one is complete, permissions follow the umask, and temporaries of dead processes are cleaned."""

import json
import os
import stat
import subprocess
import sys

import pytest

from state_reduction import atomic
from state_reduction.atomic import (
    MARKER,
    check_output,
    is_complete,
    publish_folder,
    publishing,
    remove_stale,
    temporaries,
    write_json_atomic,
)
from state_reduction.errors import OutputError, OutputExistsError


def fill(text):
    def _fill(folder):
        (folder / "a.txt").write_text(text)
        (folder / "sub").mkdir()
        (folder / "sub" / "b.bin").write_bytes(text.encode() * 3)
    return _fill


def test_folder_is_published_whole_with_marker(tmp_path):
    out = publish_folder(tmp_path / "m", fill("new"))
    assert is_complete(out) and (out / "a.txt").read_text() == "new"
    assert json.loads((out / MARKER).read_text())["files"] == {"a.txt": 3, "sub/b.bin": 9}
    assert temporaries(tmp_path) == []


def test_overwrite_replaces_and_refuses_without_flag(tmp_path):
    publish_folder(tmp_path / "m", fill("old"))
    with pytest.raises(OutputExistsError, match="--overwrite"):
        publish_folder(tmp_path / "m", fill("new"))
    publish_folder(tmp_path / "m", fill("new"), overwrite=True)
    assert (tmp_path / "m" / "a.txt").read_text() == "new" and temporaries(tmp_path) == []


def test_failure_while_filling_keeps_the_old_folder(tmp_path):
    publish_folder(tmp_path / "m", fill("old"))

    def broken(folder):
        fill("new")(folder)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        publish_folder(tmp_path / "m", broken, overwrite=True)
    assert (tmp_path / "m" / "a.txt").read_text() == "old" and is_complete(tmp_path / "m")
    assert temporaries(tmp_path) == []


def test_truncated_file_is_not_complete(tmp_path):
    out = publish_folder(tmp_path / "m", fill("abc"))
    (out / "sub" / "b.bin").write_bytes(b"x")
    assert not is_complete(out)
    (out / MARKER).unlink()
    assert not is_complete(out)


def test_permissions_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        out = publish_folder(tmp_path / "m", fill("x"))
        write_json_atomic(tmp_path / "r.json", {"a": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert stat.S_IMODE((out / "a.txt").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "r.json").stat().st_mode) == 0o644


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_temporaries_of_dead_processes_only(tmp_path):
    dead, host = _dead_pid(), atomic._HOST
    (tmp_path / f".m.{host}.{dead}.abcdef.tmp").mkdir()
    (tmp_path / f".r.json.{host}.{dead}.abcdef.tmp").write_text("{")
    alive = tmp_path / f".m.{host}.{os.getpid()}.abcdef.tmp"
    alive.mkdir()
    other_host = tmp_path / f".m.otherhost.{dead}.abcdef.tmp"
    other_host.mkdir()
    remove_stale(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, other_host.name])


def test_old_folder_set_aside_by_a_dead_publish_comes_back(tmp_path):
    """A kill between 'rename old aside' and 'rename new in' leaves no target: the next run restores it."""
    dead, host = _dead_pid(), atomic._HOST
    aside = tmp_path / f".m.{host}.{dead}.abcdef.old"
    publish_folder(aside, fill("old"))
    remove_stale(tmp_path)
    assert (tmp_path / "m" / "a.txt").read_text() == "old" and is_complete(tmp_path / "m")
    assert temporaries(tmp_path) == []


def test_file_publish_replaces_in_one_rename(tmp_path):
    path = tmp_path / "x.json"
    write_json_atomic(path, {"v": 1})
    with pytest.raises(RuntimeError):
        with publishing(path, directory=False) as tmp:
            tmp.write_text("half")
            raise RuntimeError
    assert json.loads(path.read_text()) == {"v": 1} and temporaries(tmp_path) == []


@pytest.mark.parametrize("make,directory,overwrite,message", [
    (lambda p: p.write_text("x"), True, True, "is a file, not a folder"),
    (lambda p: p.mkdir(), False, True, "is a folder, not a file"),
    (lambda p: p.mkdir(), True, False, "--overwrite"),
])
def test_check_output_kinds(tmp_path, make, directory, overwrite, message):
    make(tmp_path / "o")
    with pytest.raises(OutputError, match=message):
        check_output(tmp_path / "o", directory=directory, overwrite=overwrite)


def test_check_output_under_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputError, match="is a file, so no folder"):
        check_output(tmp_path / "f" / "sub" / "o", directory=True)


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2-exchange", "two-renames"])
def test_overwrite_paths_both_publish(tmp_path, monkeypatch, exchange):
    monkeypatch.setattr(atomic, "_EXCHANGE", exchange)
    publish_folder(tmp_path / "m", fill("old"))
    publish_folder(tmp_path / "m", fill("new"), overwrite=True)
    assert (tmp_path / "m" / "a.txt").read_text() == "new" and is_complete(tmp_path / "m")
    assert temporaries(tmp_path) == []

