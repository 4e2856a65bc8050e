"""Columns read from a companion table (`{metric: ..., table: ...}`; Tables 4, 11, 12 show the recall models' MQAR
accuracy from the tiny-only recall_table4/11/12): the companion's cell of the stand-in model, row for row; tiny-only
tables stay out of the paper profile's plans; bad companions are one-line errors."""

import pytest
import yaml
from table_fixtures import write_fixtures

import paper_tables
from paper_tables import spec
from paper_tables.lm_tables import Table
from paper_tables.metrics import METRICS, TableSpecError
from state_reduction.pipeline import PipelineError, load_experiment, plan_tasks, profile_tables, table_cells


def test_tiny_only_tables_are_not_planned_on_the_paper_profile():
    s = load_experiment("long_context")
    assert "recall_table4" in profile_tables(s, "tiny") and "recall_table4" not in profile_tables(s, "paper")
    with pytest.raises(PipelineError, match="recall_table4 .* defined on profiles tiny only, not 'paper'"):
        table_cells(s, "recall_table4", "paper")
    # the whole-experiment planner covers the tables of the profile it plans (the paper profile has no recall models)
    assert not any("mqar" in t.model for t in plan_tasks("long_context", "paper"))
    assert any(t.model == "gated_deltanet_mqar" for t in plan_tasks("long_context", "tiny"))


def test_a_companion_column_reads_the_stand_in_models_cell(tmp_path):
    write_fixtures(tmp_path, tables=["table4"], profiles=["tiny"])
    t = Table("long_context", "table4", "tiny", tmp_path)
    other = Table("long_context", "recall_table4", "tiny", tmp_path)
    col = METRICS["mqar_32_p8_acc"].of_table("recall_table4")
    for model, stand_in in zip(t.models, other.models):
        for method, ratio in (("baseline", 0.0), ("drrqr", 0.5)):
            assert t.samples(model, method, ratio, True, col) == \
                other.samples(stand_in, method, ratio, True, METRICS["mqar_32_p8_acc"])
    assert other.models == ["gated_deltanet_mqar", "qwen3_5_recall"]
    assert t.samples("gated_deltanet", "drrqr", 0.5, True, col) != []


def _edited(tmp_path, edit) -> str:
    s = yaml.safe_load((spec.EXPERIMENTS_DIR / "long_context" / "config.yaml").read_text())
    edit(s)
    path = tmp_path / "long_context.yaml"
    path.write_text(yaml.safe_dump(s, sort_keys=False))
    return str(path)


def _column(s, table):
    s["tables"]["table4"]["render"]["columns"]["tiny"][2] = {"metric": "mqar_32_p2_acc", "table": table}


@pytest.mark.parametrize("table, closest", [("recall_tabel4", "recall_table4"), ("table4", "recall_table4")])
def test_a_column_of_an_unknown_or_its_own_table_is_one_line_naming_the_key(tmp_path, table, closest):
    path = _edited(tmp_path, lambda s: _column(s, table))
    with pytest.raises(TableSpecError) as e:
        paper_tables.render("table4", "tiny", experiment=path, results_root=tmp_path, out_root=tmp_path,
                            figures_root=tmp_path, quiet=True)
    line = e.value.one_line()
    assert "tables.table4.render.columns.tiny[2].table" in line and closest in line and "\n" not in line


def test_a_companion_with_other_models_than_the_table_is_refused(tmp_path):
    def edit(s):
        s["tables"]["recall_table4"]["models"] = s["tables"]["recall_table4"]["models"][:1]
    path = _edited(tmp_path, edit)
    with pytest.raises(TableSpecError, match="needs 2 models .* got 1"):
        paper_tables.render("table4", "tiny", experiment=path, results_root=tmp_path, out_root=tmp_path,
                            figures_root=tmp_path, quiet=True)


def test_a_companion_rendered_alone_names_the_table_that_shows_it():
    with pytest.raises(TableSpecError, match="companion table, shown as columns of table4; render table4"):
        paper_tables.render("recall_table4", "tiny", quiet=True)


def test_render_run_runs_the_table_then_its_companions(monkeypatch):
    ran = []
    monkeypatch.setattr(paper_tables, "run_table", lambda exp, table, profile, **kw: ran.append((table, profile)) or [])
    paper_tables.run_missing("table11", "tiny")
    paper_tables.run_missing("table11", "paper")
    paper_tables.run_missing("table12", "tiny")
    assert ran == [("table11", "tiny"), ("recall_table11", "tiny"), ("table11", "paper"), ("table12", "tiny"),
                   ("recall_table12", "tiny")]


def test_a_companion_columns_data_caption_counts_the_companions_queries(tmp_path):
    """Table 4's MQAR columns say how many queries the recall models' evaluations scored (the companion's results),
    while its own long-context columns, whose results record no counts here, say nothing."""
    import json

    write_fixtures(tmp_path, tables=["table4"], profiles=["tiny"])
    for path in (tmp_path / "tiny" / "long_context").glob("*mqar*.json"):
        record = json.loads(path.read_text())
        record["extra"] = {"n_examples": {"mqar_32_p2": 2048, "mqar_32_p8": 2504}}
        path.write_text(json.dumps(record))
    t = Table("long_context", "table4", "tiny", tmp_path)
    columns = [METRICS["ruler_512_acc"], METRICS["mqar_32_p2_acc"].of_table("recall_table4"),
               METRICS["mqar_32_p8_acc"].of_table("recall_table4")]
    assert paper_tables.lm_tables.data_caption(t, columns, sizes={}) == (
        "Data per evaluation: MQAR 32/2 ↑ = mqar_32_p2: 2048 queries | MQAR 32/8 ↑ = mqar_32_p8: 2504 queries.")
