"""Where a result came from: code revision, package versions, hardware."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

import torch

PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def is_clone(folder: Path) -> bool:
    """A clone of this project: pyproject.toml naming `state-reduction`, and experiments/."""
    pyproject = folder / "pyproject.toml"
    if not ((folder / "experiments").is_dir() and pyproject.is_file()):
        return False
    try:
        return 'name = "state-reduction"' in pyproject.read_text()
    except OSError:
        return False


def project_root(cwd: str | Path | None = None, package_root: Path = PACKAGE_ROOT) -> Path:
    """The clone a run belongs to: $STATE_REDUCTION_ROOT, else the nearest folder at or above the working
    directory that is a clone of this project, else the clone the package is installed from (an editable
    install), else the working directory (a wheel installed outside any clone: results/ and runs/ go there).
    An editable install of clone A run inside clone B thus reads B's experiments and writes B's results
    (issue 22), not A's."""
    env = os.environ.get("STATE_REDUCTION_ROOT")
    if env:
        return Path(env).resolve()
    here = Path(cwd or os.getcwd()).resolve()
    for folder in (here, *here.parents):
        if is_clone(folder):
            return folder
    return package_root if is_clone(package_root) else here


REPO_ROOT = project_root()
TINY_MODELS_DIR = REPO_ROOT / "experiments" / "tiny_models"
TINY_CHECKPOINTS = TINY_MODELS_DIR / "checkpoints"
TRACKED_PACKAGES = ("torch", "triton", "flash-linear-attention", "transformers", "peft", "lm-eval", "datasets",
                    "tokenizers", "numpy")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, timeout=30,
                             check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def package_versions() -> dict[str, str | None]:
    versions = {}
    for name in TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def collect_provenance() -> dict:
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": None if status is None else bool(status),
        "python": platform.python_version(),
        "packages": package_versions(),
        "hardware": {
            "platform": platform.platform(), "processor": platform.processor(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        },
    }
