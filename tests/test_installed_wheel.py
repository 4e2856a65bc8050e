"""The package works from a wheel installed outside any clone (issue 14 part 5): built from src/, installed into
a fresh venv (no dependency is downloaded: the venv sees this environment's packages through a .pth line), then
`state-reduction prune` on a tiny checkpoint copied out of the checkout, run from a folder that is no clone."""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from state_reduction.data import resolve_data_dir

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINT = ROOT / "experiments" / "tiny_models" / "checkpoints" / "deltanet"


def _run(cmd, **kw):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert out.returncode == 0, f"{' '.join(map(str, cmd))}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"  # a copy, so the build leaves no build/ or egg-info in the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
          "-w", str(tmp / "dist"), str(source)])
    wheel = next((tmp / "dist").glob("state_reduction-*.whl"))
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    purelib = Path(_run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
                        ).stdout.strip())
    # a plain path line: this environment's packages, but not its editable install of the checkout (a .pth
    # file inside that folder is not run from here)
    (purelib / "shared_environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed",
          str(wheel)])
    work = tmp / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "STATE_REDUCTION_ROOT",
                                                             "STATE_REDUCTION_DATA")}
    env.update(XDG_CACHE_HOME=str(tmp / "xdg"), OMP_NUM_THREADS="1")
    return {"venv": venv, "work": work, "env": env, "tmp": tmp}


@pytest.mark.slow
def test_an_installed_wheel_prunes_a_checkpoint_outside_the_checkout(installed):
    venv, work, env = installed["venv"], installed["work"], installed["env"]
    where = _run([venv / "bin" / "python", "-c",
                  "import state_reduction; from state_reduction.provenance import REPO_ROOT; "
                  "from state_reduction.data import resolve_data_dir; "
                  "print(state_reduction.__file__); print(REPO_ROOT); print(resolve_data_dir())"],
                 cwd=work, env=env).stdout.split()
    assert Path(where[0]).is_relative_to(venv)  # the wheel's copy, not the checkout's sources
    assert Path(where[1]) == work.resolve()  # results/ and runs/ under the working directory
    assert Path(where[2]) == installed["tmp"] / "xdg" / "state_reduction" / "data"

    model = work / "deltanet"
    shutil.copytree(CHECKPOINT, model)
    env = env | {"STATE_REDUCTION_DATA": str(resolve_data_dir())}  # the corpora this checkout already fetched
    out = _run([venv / "bin" / "state-reduction", "prune", "deltanet", "--method", "wanda", "--ratio", "0.5",
                "--n-calib", "2", "--seq-len", "32", "--batch-size", "2", "--out", "pruned"], cwd=work, env=env)
    assert "result: pruned/prune_result.json" in out.stdout
    assert (work / "pruned" / "model.safetensors").is_file() and (work / "pruned" / "prune_result.json").is_file()
    assert not (ROOT / "build").exists()
