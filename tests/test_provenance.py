"""Which clone a run belongs to: an editable install of one clone run inside another writes the other's results."""

from pathlib import Path

from state_reduction.provenance import PACKAGE_ROOT, project_root


def _clone(path: Path) -> Path:
    (path / "experiments").mkdir(parents=True)
    (path / "pyproject.toml").write_text('[project]\nname = "state-reduction"\n')
    return path


def test_the_working_clone_wins_over_the_installed_one(tmp_path, monkeypatch):
    monkeypatch.delenv("STATE_REDUCTION_ROOT", raising=False)
    other = _clone(tmp_path / "other-clone")
    (other / "experiments" / "deltanet_gdn").mkdir()
    assert project_root(other) == other
    assert project_root(other / "experiments" / "deltanet_gdn") == other  # from a subfolder too
    assert project_root(tmp_path) == PACKAGE_ROOT  # outside any clone: the installed one


def test_a_foreign_project_is_not_taken_for_a_clone(tmp_path, monkeypatch):
    monkeypatch.delenv("STATE_REDUCTION_ROOT", raising=False)
    (tmp_path / "experiments").mkdir()
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "something-else"\n')
    assert project_root(tmp_path) == PACKAGE_ROOT


def test_the_environment_variable_names_the_root(tmp_path, monkeypatch):
    monkeypatch.setenv("STATE_REDUCTION_ROOT", str(tmp_path))
    assert project_root(PACKAGE_ROOT) == tmp_path.resolve()


def test_an_installed_wheel_outside_any_clone_works_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("STATE_REDUCTION_ROOT", raising=False)
    site_packages = tmp_path / "venv" / "lib" / "python3" / "site-packages"
    site_packages.mkdir(parents=True)
    (tmp_path / "work").mkdir()
    assert project_root(tmp_path / "work", package_root=site_packages.parent.parent) == tmp_path / "work"
