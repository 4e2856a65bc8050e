"""Every table rendered from the fixture results (table_fixtures.py) is byte-identical to its golden, rendered by
the per-table scripts before paper_tables became a package with layouts as data (b558dfa). The other renderers
(rank analysis, speed, MQAR, state vs structure, RaLiMP: output_fixtures.py) are compared with goldens rendered
by their code at integ e4376c2, before their collecting and writing moved to the shared collector and writers.
Figures are written but not compared (PNG/PDF bytes depend on the matplotlib build)."""

import pytest
from output_fixtures import FIGURE_ONLY, golden_dir, render_target, write_output_fixtures
from output_fixtures import OUTPUTS as RENDERED
from table_fixtures import GOLDEN, OUTPUTS, PROFILES, SEEDED, TABLES, golden_files, write_fixtures

import paper_tables

CASES = [(t, None) for t in TABLES] + [(t, seeds) for t, seeds in SEEDED.items()]
OUTPUT_CASES = [(t, p) for t, profiles in RENDERED.items() for p in profiles]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("fixtures")
    write_fixtures(root)
    return root


@pytest.fixture(scope="module")
def output_results(tmp_path_factory):
    root = tmp_path_factory.mktemp("output_fixtures")
    write_output_fixtures(root)
    return root


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("table, seeds", CASES, ids=[t + ("_seeds" if s else "") for t, s in CASES])
def test_rendered_tables_equal_the_goldens(results, tmp_path, table, seeds, profile):
    expected = golden_files(profile, table, seeded=seeds is not None)
    if not all(p.is_file() for p in expected):
        pytest.fail(f"no golden for {table} ({profile}) in {GOLDEN}: see tests/paper_tables/table_fixtures.py")
    paper_tables.render(table, profile, results_root=results, out_root=tmp_path / "out",
                        figures_root=tmp_path / "figures", quiet=True, seeds=seeds)
    for suffix, golden in zip(OUTPUTS, expected):
        ours = tmp_path / "out" / profile / f"{table}{suffix}"
        assert ours.read_text() == golden.read_text(), f"{ours.name} differs from {golden}"


@pytest.mark.parametrize("target, profile", OUTPUT_CASES, ids=[f"{t}-{p}" for t, p in OUTPUT_CASES])
def test_other_renderers_equal_their_goldens(output_results, tmp_path, target, profile):
    folder = golden_dir(profile, target)
    expected = {p.name: p.read_text() for p in sorted(folder.glob("*"))} if folder.is_dir() else {}
    if not expected and target not in FIGURE_ONLY:
        pytest.fail(f"no golden for {target} ({profile}) in {folder}: see tests/paper_tables/output_fixtures.py")
    texts, figures = render_target(target, profile, output_results, tmp_path)
    assert sorted(texts) == sorted(expected), f"{target} ({profile}) wrote other files than its goldens"
    for name, text in texts.items():
        assert text == expected[name], f"{name} differs from {folder / name}"
    if target.startswith("figure") or target in ("state_vs_structure", "ralimp_synthetic"):
        assert figures and all(p.stat().st_size > 0 for p in figures), f"{target} ({profile}) wrote no figure"
