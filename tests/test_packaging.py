"""Layout and packaging: the conda environment agrees with pyproject, the console script exists."""

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def _pyproject_requirements() -> dict[str, Requirement]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = meta["dependencies"] + meta["optional-dependencies"]["test"]
    return {Requirement(r).name.lower(): Requirement(r) for r in reqs}


def _environment_pins() -> dict[str, Requirement]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    out = {}
    for line in pip:
        if line.startswith("-") or "@" in line:
            continue
        req = Requirement(line)
        out[req.name.lower()] = req
    return out


def test_top_level_layout():
    for name in ["README.md", "Makefile", "environment.yml", "src", "experiments", "paper_tables", "figures",
                 "slurm", "tests", "pyproject.toml", ".ci/run"]:
        assert (ROOT / name).exists(), name


def test_environment_pins_agree_with_pyproject():
    project, env = _pyproject_requirements(), _environment_pins()
    for name, req in project.items():
        assert name in env, f"environment.yml lacks {name} (pyproject: {req})"
        pinned = [s.version for s in env[name].specifier if s.operator == "=="]
        if pinned:
            assert req.specifier.contains(pinned[0], prereleases=True), \
                f"{name}: environment.yml pins {pinned[0]}, pyproject wants {req.specifier}"
        else:
            assert str(env[name].specifier) == str(req.specifier), f"{name}: {env[name]} vs {req}"
        exact = [s.version for s in req.specifier if s.operator == "=="]
        if exact:
            assert pinned == exact, f"{name}: pyproject pins {exact}, environment.yml {pinned}"


def test_environment_installs_flame_from_git():
    env_text = (ROOT / "environment.yml").read_text()
    assert re.search(r"flame @ git\+https://github.com/fla-org/flame", env_text)


def test_console_script_runs():
    exe = shutil.which("state-reduction", path=str(Path(sys.executable).parent))
    assert exe, "console script state-reduction not installed"
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "state-reduction" in out.stdout


def test_ci_runs_the_readme_test_command():
    readme, ci = (ROOT / "README.md").read_text(), (ROOT / ".ci/run").read_text()
    assert "make test" in readme and "make table20" in readme
    assert re.search(r"^make test\b", ci, re.M)


def test_setup_is_idempotent():
    """A second `make setup` on an installed tree does nothing (the stamp is newer than pyproject)."""
    out = subprocess.run(["make", "-n", "setup"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Nothing to be done" in out.stdout or out.stdout.strip() == "", out.stdout


def test_environment_brings_mamba2_cuda_kernels():
    """Without mamba_ssm and causal_conv1d, Mamba-Codestral-7B runs transformers' torch reference scan on CUDA."""
    env = _environment_pins()
    assert "mamba-ssm" in env and "causal-conv1d" in env
