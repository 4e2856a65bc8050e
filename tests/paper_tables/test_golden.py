"""Every table rendered from the fixture results (table_fixtures.py) is byte-identical to its golden, rendered by
the per-table scripts before paper_tables became a package with layouts as data (b558dfa). Figures are written
but not compared (PNG/PDF bytes depend on the matplotlib build)."""

import pytest
from table_fixtures import GOLDEN, OUTPUTS, PROFILES, SEEDED, TABLES, golden_files, write_fixtures

import paper_tables

CASES = [(t, None) for t in TABLES] + [(t, seeds) for t, seeds in SEEDED.items()]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("fixtures")
    write_fixtures(root)
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
