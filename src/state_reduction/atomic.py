"""Crash-safe outputs: the one way this project writes an artefact (model folder, state, result, cache file).

`publishing(target)` yields a temporary path beside `target` (same filesystem), the caller fills it, and on
success the contents are fsynced and published by a rename, the last step:

- a file replaces its target in one `os.replace`: a reader sees the old file or the new one, never half;
- a folder gets a completion marker (MARKER, written last, listing every file and its size), then it is
  renamed in; an existing folder is swapped with it in one step (renameat2 RENAME_EXCHANGE) and deleted after.
  Where the filesystem cannot swap, the old folder is renamed aside, the new one renamed in, and the old one
  deleted; a kill between those two renames leaves the old folder aside and the next run renames it back.

Temporary and set-aside names are `.NAME.HOST.PID.RAND.tmp|old`; `remove_stale(parent)` deletes those of
processes of this host that no longer exist (restoring an old folder whose target is missing), and runs at
the start of every publish and sweep. Files and folders are created with the umask's permissions.

`fault_point(name)` SIGKILLs the process at the n-th hit of a named point when STATE_REDUCTION_FAULT says so
(the kill tests); STATE_REDUCTION_FAULT_TRACE=FILE appends each point hit to FILE.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import re
import secrets
import shutil
import signal
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from state_reduction.errors import OutputError, OutputExistsError

MARKER = "complete.json"
_HOST = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname()) or "host"
_NAME = re.compile(r"^\.(?P<name>.+)\.(?P<host>[A-Za-z0-9-]+)\.(?P<pid>\d+)\.[0-9a-f]{6}\.(?P<kind>tmp|old)$")


# -- fault injection (tests) ----------------------------------------------------------------------------------
_hits: dict[str, int] = {}


def fault_point(name: str) -> None:
    """STATE_REDUCTION_FAULT=NAME:N kills this process (SIGKILL) at the N-th time it reaches NAME; `*:N` at
    the N-th point of any name. Costs one dict lookup when unset."""
    spec = os.environ.get("STATE_REDUCTION_FAULT")
    trace = os.environ.get("STATE_REDUCTION_FAULT_TRACE")
    if not spec and not trace:
        return
    _hits[name] = _hits.get(name, 0) + 1
    _hits["*"] = _hits.get("*", 0) + 1
    if trace:
        with open(trace, "a") as f:
            f.write(f"{name}\n")
    if spec:
        want, _, n = spec.rpartition(":")
        if _hits.get(want) == int(n):
            os.kill(os.getpid(), signal.SIGKILL)


# -- names ----------------------------------------------------------------------------------------------------
def _sibling(target: Path, kind: str) -> Path:
    return target.with_name(f".{target.name}.{_HOST}.{os.getpid()}.{secrets.token_hex(3)}.{kind}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def remove_stale(parent: str | os.PathLike) -> list[Path]:
    """Delete the temporaries of dead processes of this host in `parent`; an old folder set aside by a publish
    that died between its two renames goes back to its name if nothing took it. Returns what it touched."""
    parent = Path(parent)
    touched = []
    if not parent.is_dir():
        return touched
    for entry in parent.iterdir():
        m = _NAME.match(entry.name)
        if m is None or m["host"] != _HOST or _alive(int(m["pid"])):
            continue
        target = parent / m["name"]
        if m["kind"] == "old" and not target.exists():
            os.rename(entry, target)
        else:
            _remove(entry)
        touched.append(entry)
    return touched


def temporaries(parent: str | os.PathLike) -> list[Path]:
    """Every temporary or set-aside entry in `parent` (any host, any process): what a test expects to be gone."""
    parent = Path(parent)
    return sorted(p for p in parent.iterdir() if _NAME.match(p.name)) if parent.is_dir() else []


# -- durability -----------------------------------------------------------------------------------------------
def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for f in files:
            _fsync_path(Path(dirpath) / f)
        _fsync_path(Path(dirpath))


def _write_marker(folder: Path) -> None:
    files = {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*"))
             if p.is_file() and p.name != MARKER}
    (folder / MARKER).write_text(json.dumps({"files": files}, indent=1, sort_keys=True) + "\n")


def is_complete(folder: str | os.PathLike) -> bool:
    """The folder was published whole: its marker exists and every file it lists has the listed size."""
    folder = Path(folder)
    try:
        files = json.loads((folder / MARKER).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    try:
        return all((folder / name).stat().st_size == size for name, size in files.items())
    except OSError:
        return False


def _cannot_write(folder: Path) -> str | None:
    """Why nothing can be created in `folder` (creating and removing a probe folder there), or None."""
    probe = _sibling(folder / "write-probe", "tmp")
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as e:
        return e.strerror or type(e).__name__
    return None


# -- checks before compute ------------------------------------------------------------------------------------
def check_output(target: str | os.PathLike, *, directory: bool, overwrite: bool = False,
                 option: str = "--out") -> Path:
    """Before any compute: `target` can be published (its parent is, or can be created as, a writable folder;
    an existing target is of the right kind and `overwrite` is given). Stale temporaries there are removed."""
    target = Path(target)
    what = "folder" if directory else "file"
    if target.exists() or target.is_symlink():
        if target.is_dir() != directory:
            found = "a folder" if target.is_dir() else "a file"
            raise OutputError(f"{option} {target} is {found}, not a {what}",
                              hint=f"remove it or choose another {option}")
        if not overwrite:
            raise OutputExistsError(f"{option} {target} exists", hint="pass --overwrite to replace it")
    ancestor = target.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputError(f"{option} {target}: {ancestor} is a file, so no folder can be created under it",
                          hint=f"choose another {option}")
    problem = _cannot_write(ancestor)
    if problem:
        raise OutputError(f"{option} {target}: cannot write in {ancestor} ({problem})",
                          hint=f"choose a writable {option} or fix the folder's permissions")
    remove_stale(target.parent)
    return target


# -- publishing -----------------------------------------------------------------------------------------------
def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where the OS or filesystem cannot."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            _libc.renameat2  # noqa: B018  (glibc >= 2.28)
        except (OSError, AttributeError):
            _libc = False
    if not _libc or not _EXCHANGE:
        return False
    at_fdcwd, rename_exchange = -100, 2
    return _libc.renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


_libc = None
_EXCHANGE = True  # tests switch it off to exercise the two-rename path


def _replace_folder(tmp: Path, target: Path) -> None:
    """Put the complete folder `tmp` in place of the existing `target`, whose old contents are deleted after.
    Where the kernel can swap the two names atomically, `target` is never absent and `tmp` then holds the old
    folder; else the old folder is renamed aside first and remove_stale restores it if a kill intervenes."""
    if _exchange(tmp, target):
        _fsync_path(target.parent)
        fault_point("publish:swapped")
        shutil.rmtree(tmp)
        return
    old = _sibling(target, "old")
    os.rename(target, old)
    fault_point("publish:old-aside")
    os.rename(tmp, target)
    _fsync_path(target.parent)
    fault_point("publish:renamed")
    shutil.rmtree(old)


@contextlib.contextmanager
def publishing(target: str | os.PathLike, *, directory: bool, overwrite: bool = True,
               option: str = "output") -> Iterator[Path]:
    """Yield a temporary path beside `target` (an empty folder if `directory`, else a file name to create);
    on a normal exit publish it as `target` (module docstring); on an exception delete it, target untouched."""
    target = Path(target)
    if target.exists() and target.is_dir() != directory:
        raise OutputError(f"{option} {target} is {'a folder' if target.is_dir() else 'a file'}, not a "
                          f"{'folder' if directory else 'file'}", hint="remove it or choose another path")
    if target.exists() and not overwrite:
        raise OutputExistsError(f"{option} {target} exists", hint="pass --overwrite to replace it")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise OutputError(f"{option} {target}: a parent of it is a file", hint="choose another path") from None
    remove_stale(target.parent)
    tmp = _sibling(target, "tmp")
    if directory:
        tmp.mkdir()
    try:
        fault_point("publish:begin")
        yield tmp
        fault_point("publish:filled")
        if directory:
            _write_marker(tmp)
            _fsync_tree(tmp)
        else:
            _fsync_path(tmp)
        fault_point("publish:synced")
        if directory and target.exists():
            _replace_folder(tmp, target)
        else:
            os.replace(tmp, target)
            _fsync_path(target.parent)
            fault_point("publish:renamed")
    except BaseException:
        _remove(tmp)
        raise


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    with publishing(path, directory=False) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    return write_bytes_atomic(path, text.encode())


def write_json_atomic(path: str | os.PathLike, obj) -> Path:
    return write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def save_torch_atomic(path: str | os.PathLike, obj) -> Path:
    with publishing(path, directory=False) as tmp:
        torch.save(obj, tmp)
    return Path(path)


def publish_folder(target: str | os.PathLike, fill: Callable[[Path], None], *, overwrite: bool = False,
                   option: str = "output") -> Path:
    """`fill(tmp_folder)` writes the folder's files; then it is published as `target`."""
    with publishing(target, directory=True, overwrite=overwrite, option=option) as tmp:
        fill(tmp)
    return Path(target)


@contextlib.contextmanager
def scratch_folder(parent: str | os.PathLike) -> Iterator[Path]:
    """A temporary folder in `parent` (same filesystem as what is published from it), removed on exit; one a
    kill leaves behind is stale for `remove_stale`."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    remove_stale(parent)
    tmp = _sibling(parent / "scratch", "tmp")
    tmp.mkdir()
    try:
        yield tmp
    finally:
        _remove(tmp)


__all__ = ["MARKER", "OutputError", "OutputExistsError", "check_output", "fault_point", "is_complete",
           "publish_folder", "publishing", "remove_stale", "save_torch_atomic", "scratch_folder", "temporaries",
           "write_bytes_atomic", "write_json_atomic", "write_text_atomic"]
