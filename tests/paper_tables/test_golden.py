"""Every table rendered from the fixture results (table_fixtures.py) is byte-identical to its golden, saved from
the per-table scripts before paper_tables became a package with layouts as data. Figures are written but not
compared (PNG/PDF bytes depend on the matplotlib build)."""

import pytest
from table_fixtures import GOLDEN, OUTPUTS, PROFILES, TABLES, golden_files, write_fixtures

import paper_tables


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("fixtures")
    write_fixtures(root)
    return root


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("table", TABLES)
def test_rendered_tables_equal_the_goldens(results, tmp_path, table, profile):
    expected = golden_files(profile, table)
    if not all(p.is_file() for p in expected):
        pytest.fail(f"no golden for {table} ({profile}) in {GOLDEN}: run `python tests/paper_tables/table_fixtures.py`")
    paper_tables.render(table, profile, results_root=results, out_root=tmp_path / "out",
                        figures_root=tmp_path / "figures", quiet=True)
    for suffix, golden in zip(OUTPUTS, expected):
        ours = tmp_path / "out" / profile / f"{table}{suffix}"
        assert ours.read_text() == golden.read_text(), f"{ours.name} differs from {golden}"
