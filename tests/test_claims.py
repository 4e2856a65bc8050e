"""Claims as data: verdicts from result files, the evidence file, the README block and its staleness check."""

import json

import pytest
import yaml

from state_reduction import claims
from state_reduction.claims import FAILS, HOLDS, INCONCLUSIVE, ClaimError
from state_reduction.results import build_result, write_result

# mean drrqr ppl ~ 100, l1 ~ 110, rand ~ 104 with a large spread; seeds 0-2
PPL = {"drrqr": [100.0, 101.0, 99.5], "l1": [110.0, 111.0, 109.0], "rand": [90.0, 118.0, 104.0]}


def _write_results(root, experiment="toy", ppl=PPL):
    for method, values in ppl.items():
        for seed, v in enumerate(values):
            r = build_result("evaluate", profile="tiny", experiment=experiment,
                             config={"method": method, "ratio": 0.5, "prune": {"seed": seed}},
                             metrics={"wiki_ppl": v, "acc": 0.5}, model=None, data={}, seeds={"calibration": seed},
                             wall_time_s=0.0)
            write_result(root / "tiny" / experiment / f"{method}-{seed}.json", r)


def _claim(cid, lhs, op, rhs, **kw):
    side = (lambda m: {"kind": "evaluate", "where": {"method": m, "ratio": 0.5}, "metric": "wiki_ppl"})
    return {"id": cid, "text": cid.replace("_", " "), "paper": "Table X", "lhs": side(lhs), "op": op,
            "rhs": side(rhs) if isinstance(rhs, str) else rhs, **kw}


@pytest.fixture
def experiment(tmp_path, monkeypatch):
    """An experiment folder `toy` with claims, its README, and results under tmp_path/results."""
    exp_dir = tmp_path / "experiments" / "toy"
    exp_dir.mkdir(parents=True)
    monkeypatch.setattr(claims, "EXPERIMENTS_DIR", tmp_path / "experiments")
    (exp_dir / "README.md").write_text("# toy\n\nSome prose.\n")
    _write_results(tmp_path / "results")

    def declare(*claim_list):
        (exp_dir / "config.yaml").write_text(yaml.safe_dump({"experiment": "toy", "claims": list(claim_list)}))
    return declare, tmp_path / "results", exp_dir


def test_verdicts_from_results(experiment):
    declare, root, _ = experiment
    declare(_claim("drrqr_beats_l1", "drrqr", "<", "l1", pair_by="seed"),
            _claim("l1_beats_drrqr", "l1", "<", "drrqr", pair_by="seed"),
            _claim("rand_vs_drrqr", "rand", ">", "drrqr"),
            _claim("drrqr_below_105", "drrqr", "<", 105),
            _claim("drrqr_within_5pct_of_l1", "drrqr", "<", "l1", relative=True, margin=-0.05))
    v = {x.claim.id: x for x in claims.evaluate_claims("toy", "tiny", root)}
    assert v["drrqr_beats_l1"].status == HOLDS
    assert v["drrqr_beats_l1"].diff.mean == pytest.approx(100.1666667 - 110.0)
    assert v["l1_beats_drrqr"].status == FAILS
    assert v["rand_vs_drrqr"].status == INCONCLUSIVE  # rand's spread covers drrqr
    assert "contains 0" in v["rand_vs_drrqr"].reason
    assert v["drrqr_below_105"].status == HOLDS
    # relative difference ~ -8.9%: below -5% with every seed agreeing
    assert v["drrqr_within_5pct_of_l1"].diff.mean == pytest.approx((100.1666667 - 110.0) / 110.0)
    assert v["drrqr_within_5pct_of_l1"].status == HOLDS


def test_one_seed_is_inconclusive_not_plus_minus_zero(tmp_path, monkeypatch, experiment):
    declare, root, _ = experiment
    single = tmp_path / "single"
    _write_results(single, ppl={"drrqr": [100.0], "l1": [120.0]})
    declare(_claim("drrqr_beats_l1", "drrqr", "<", "l1"))
    (v,) = claims.evaluate_claims("toy", "tiny", single)
    assert v.status == INCONCLUSIVE and v.reason == "one sample, no CI"
    block = claims.render_block("toy", "tiny", [v])
    assert "±" not in block.split("| --- |")[-1]


def test_bad_claims_name_the_claim_file_key_and_closest_names(experiment):
    declare, root, _ = experiment
    declare(_claim("typo_key", "drrqr", "<", "l1") | {"pair_bye": "seed"})
    with pytest.raises(ClaimError, match=r"config.yaml: claim 'typo_key': unknown key 'pair_bye'; did you mean 'pair_by'"):
        claims.load_claims("toy")
    declare(_claim("bad_op", "drrqr", "<<", "l1"))
    with pytest.raises(ClaimError, match="op must be one of"):
        claims.load_claims("toy")
    declare({**_claim("no_metric", "drrqr", "<", "l1"), "lhs": {"kind": "evaluate", "where": {"method": "drrqr"},
                                                                 "metric": "wiki_pp"}})
    with pytest.raises(ClaimError, match=r"claim 'no_metric' .* lhs: no result matches .*no result has the metric "
                                         r"'wiki_pp'; did you mean 'wiki_ppl'"):
        claims.evaluate_claims("toy", "tiny", root)
    declare(_claim("no_cell", "grad", "<", "l1"))
    with pytest.raises(ClaimError, match=r"claim 'no_cell' .* lhs: no result matches kind=evaluate "
                                         r"wiki_ppl\[method=grad, ratio=0.5\]; run the experiment first"):
        claims.evaluate_claims("toy", "tiny", root)
    declare({**_claim("no_field", "drrqr", "<", "l1"), "pair_by": "sede"})
    with pytest.raises(ClaimError, match="no result has the field 'sede'; did you mean 'seed'"):
        claims.evaluate_claims("toy", "tiny", root)
    with pytest.raises(ClaimError, match="has no experiments/tyo/config.yaml; did you mean 'toy'"):
        claims.load_claims("tyo")


def test_write_then_check_readme_and_staleness(experiment):
    declare, root, exp_dir = experiment
    declare(_claim("drrqr_beats_l1", "drrqr", "<", "l1", pair_by="seed"))
    claims.write_verdicts("toy", "tiny", root)
    text = (exp_dir / "README.md").read_text()
    assert text.startswith("# toy\n\nSome prose.\n") and claims.VERDICT_BEGIN in text
    assert "**holds**" in text and "Table X" in text
    evidence = json.loads((exp_dir / "verdicts_tiny.json").read_text())
    assert evidence["claims"][0]["samples"]["lhs"] == [["0", 100.0], ["1", 101.0], ["2", 99.5]]
    assert claims.check_readme("toy") == []
    # rewriting replaces the block in place (no second block)
    claims.write_verdicts("toy", "tiny", root)
    assert (exp_dir / "README.md").read_text().count(claims.VERDICT_BEGIN) == 1
    # a hand-edited verdict is stale
    (exp_dir / "README.md").write_text(text.replace("**holds**", "**holds strongly**"))
    assert "differs" in claims.check_readme("toy")[0]
    # a claim edited after the evidence was written is an error naming it
    declare(_claim("drrqr_beats_l1", "drrqr", "<=", "l1", pair_by="seed"))
    with pytest.raises(ClaimError, match="claim 'drrqr_beats_l1' .* changed since .*verdicts_tiny.json"):
        claims.check_readme("toy")


def test_keep_re_decides_only_the_claims_with_results_and_keeps_the_others_evidence(experiment, tmp_path, capsys):
    from state_reduction.cli import main

    declare, root, exp_dir = experiment
    declare(_claim("drrqr_beats_l1", "drrqr", "<", "l1", pair_by="seed"),
            _claim("rand_vs_drrqr", "rand", ">", "drrqr"))
    claims.write_verdicts("toy", "tiny", root)
    kept = json.loads((exp_dir / "verdicts_tiny.json").read_text())["claims"][1]
    # a rerun of one part: only drrqr and l1 results, with new values; rand's results are not here
    part = tmp_path / "part"
    _write_results(part, ppl={"drrqr": [120.0, 121.0, 119.0], "l1": [110.0, 111.0, 109.0]})
    with pytest.raises(ClaimError, match="claim 'rand_vs_drrqr' .* lhs: no result matches"):
        claims.write_verdicts("toy", "tiny", part)
    assert main(["verdicts", "toy", "--results-root", str(part), "--write", "--keep"]) == 0
    v = {x.claim.id: x for x in claims.verdicts_from_evidence("toy", "tiny")}
    assert v["drrqr_beats_l1"].status == FAILS  # re-decided from the new results
    assert json.loads((exp_dir / "verdicts_tiny.json").read_text())["claims"][1] == kept
    assert claims.check_readme("toy") == []
    # kept evidence is only for an unchanged definition, and a side with results but a missing other side still fails
    declare(_claim("drrqr_beats_l1", "drrqr", "<", "l1", pair_by="seed"), _claim("rand_vs_drrqr", "rand", ">=", "drrqr"))
    with pytest.raises(ClaimError, match="claim 'rand_vs_drrqr' .* lhs: no result matches"):
        claims.evaluate_claims("toy", "tiny", part, keep=True)
    declare(_claim("drrqr_vs_rand", "drrqr", "<", "rand"))  # new: no evidence to keep
    with pytest.raises(ClaimError, match="claim 'drrqr_vs_rand' .* rhs: no result matches"):
        claims.evaluate_claims("toy", "tiny", part, keep=True)
    # a claim with one side here and the other not keeps its evidence whole (no mixing of new and kept samples)
    declare(_claim("rand_vs_drrqr", "drrqr", "<", "rand"))
    claims.write_verdicts("toy", "tiny", root)
    before = json.loads((exp_dir / "verdicts_tiny.json").read_text())["claims"][0]
    (v,) = claims.evaluate_claims("toy", "tiny", part, keep=True)
    assert v.samples == before["samples"] and v.lhs.mean == pytest.approx(100.1666667)


def test_cli_prints_verdicts_and_one_line_errors(experiment, capsys):
    from state_reduction.cli import main

    declare, root, _ = experiment
    declare(_claim("drrqr_beats_l1", "drrqr", "<", "l1", pair_by="seed"))
    assert main(["verdicts", "toy", "--results-root", str(root)]) == 0
    assert "holds  drrqr_beats_l1" in capsys.readouterr().out
    declare(_claim("no_cell", "grad", "<", "l1"))
    assert main(["verdicts", "toy", "--results-root", str(root)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no_cell" in err


def test_render_summary_decides_what_is_here_and_counts_the_claims_without_results(experiment, tmp_path):
    """What `make <table>` prints after rendering: a one-seed run is inconclusive, a claim with no results counted."""
    declare, root, _ = experiment
    single = tmp_path / "single"
    _write_results(single, ppl={"drrqr": [100.0], "l1": [120.0]})
    declare(_claim("drrqr_beats_l1", "drrqr", "<", "l1", pair_by="seed"), _claim("rand_vs_drrqr", "rand", ">", "drrqr"))
    lines = claims.render_summary("toy", "tiny", single)
    assert "inconclusive  drrqr_beats_l1" in lines[1] and "one sample, no CI" in lines[1]
    assert lines[2] == "(1 of 2 claims have no results here: rand_vs_drrqr)"
    assert "verdicts_tiny.json" in lines[-1] and "state-reduction verdicts toy --profile tiny --write" in lines[-1]
    lines = claims.render_summary("toy", "tiny", root)
    assert "holds  drrqr_beats_l1" in lines[1] and "inconclusive  rand_vs_drrqr" in lines[2] and len(lines) == 4
    declare(_claim("bad_pairing", "drrqr", "<", "l1", pair_by="nope"))  # a claim error is said, the render stands
    lines = claims.render_summary("toy", "tiny", root)
    assert lines[1].startswith("- not decided  bad_pairing:") and "'nope'" in lines[1]
    declare()
    assert claims.render_summary("toy", "tiny", root) == []


@pytest.mark.parametrize("experiment_name", claims.experiments_with_claims())
def test_every_readme_verdict_block_is_current(experiment_name):
    """The README block of every experiment with claims equals the one generated from its committed evidence."""
    assert claims.check_readme(experiment_name, claims.claims_profile(experiment_name)) == []


def test_fixed_rhs_and_pairing_rows_without_the_field(experiment, tmp_path):
    """A deterministic dense evaluation is a fixed value; the pipeline's first replicate has no seed field."""
    declare, _, _ = experiment
    root = tmp_path / "fixed"
    for name, config, v in (("base", {"method": "baseline"}, 100.0),
                            ("a0", {"method": "drrqr"}, 104.0), ("a1", {"method": "drrqr", "vary": {"seed": 1}}, 105.0),
                            ("a2", {"method": "drrqr", "vary": {"seed": 2}}, 104.5),
                            ("b0", {"method": "l1"}, 110.0), ("b1", {"method": "l1", "vary": {"seed": 1}}, 111.0),
                            ("b2", {"method": "l1", "vary": {"seed": 2}}, 109.0)):
        write_result(root / "tiny" / "toy" / f"{name}.json",
                     build_result("evaluate", profile="tiny", experiment="toy", config=config,
                                  metrics={"wiki_ppl": v}, model=None, data={}, seeds={}, wall_time_s=0.0))
    side = (lambda m: {"kind": "evaluate", "where": {"method": m}, "metric": "wiki_ppl"})
    declare({"id": "within_10pct_of_dense", "text": "t", "lhs": side("drrqr"), "op": "<", "rhs": side("baseline"),
             "rhs_fixed": True, "relative": True, "margin": 0.10},
            {"id": "paired", "text": "t", "lhs": side("drrqr"), "op": "<", "rhs": side("l1"), "pair_by": "seed"})
    v = {x.claim.id: x for x in claims.evaluate_claims("toy", "tiny", root)}
    assert v["within_10pct_of_dense"].rhs == 100.0 and v["within_10pct_of_dense"].status == HOLDS
    assert v["within_10pct_of_dense"].diff.mean == pytest.approx(0.045)
    assert v["paired"].diff.n == 3 and v["paired"].status == HOLDS  # pairs (default), 1, 2
    declare({"id": "not_fixed", "text": "t", "lhs": side("drrqr"), "op": "<", "rhs": side("l1"), "rhs_fixed": True})
    with pytest.raises(ClaimError, match="rhs_fixed, but the rhs has 3 results"):
        claims.evaluate_claims("toy", "tiny", root)


def test_a_null_where_selects_results_without_the_field(experiment, tmp_path):
    """`budget: null` picks the cells at the default budget, whose results carry no budget field (issue 17)."""
    declare, _, _ = experiment
    root = tmp_path / "null"
    for seed, (uniform, adaptive) in enumerate(((100.0, 90.0), (101.0, 92.0), (99.0, 89.5))):
        for budget, v in ((None, uniform), ("global-aire", adaptive)):
            vary = {"seed": seed, **({"budget": budget} if budget else {})}
            write_result(root / "tiny" / "toy" / f"{budget}-{seed}.json",
                         build_result("evaluate", profile="tiny", experiment="toy", config={"vary": vary},
                                      metrics={"ppl": v}, model=None, data={}, seeds={}, wall_time_s=0.0))
    side = (lambda b: {"kind": "evaluate", "where": {"budget": b}, "metric": "ppl"})
    declare({"id": "adaptive", "text": "t", "lhs": side("global-aire"), "op": "<", "rhs": side(None), "pair_by": "seed"})
    (v,) = claims.evaluate_claims("toy", "tiny", root)
    assert v.diff.n == 3 and v.diff.mean == pytest.approx(-28.5 / 3) and v.status == HOLDS


def test_increase_over_a_reference_with_a_factor(experiment, tmp_path):
    """`over` + `factor`: "(lhs - dense) <= 0.8 (rhs - dense)", paired by seed; the evidence re-derives it."""
    declare, _, exp_dir = experiment
    root = tmp_path / "increase"
    for name, config, v in (("base", {"method": "baseline"}, 100.0),
                            ("a0", {"method": "ours"}, 104.0), ("a1", {"method": "ours", "vary": {"seed": 1}}, 106.0),
                            ("a2", {"method": "ours", "vary": {"seed": 2}}, 105.0),
                            ("b0", {"method": "drrqr"}, 110.0), ("b1", {"method": "drrqr", "vary": {"seed": 1}}, 111.0),
                            ("b2", {"method": "drrqr", "vary": {"seed": 2}}, 109.0)):
        write_result(root / "tiny" / "toy" / f"{name}.json",
                     build_result("evaluate", profile="tiny", experiment="toy", config=config,
                                  metrics={"wiki_ppl": v}, model=None, data={}, seeds={}, wall_time_s=0.0))
    side = (lambda m: {"kind": "evaluate", "where": {"method": m}, "metric": "wiki_ppl"})
    bar = {"lhs": side("ours"), "op": "<=", "rhs": side("drrqr"), "pair_by": "seed", "over": side("baseline")}
    declare({"id": "at_08", "text": "t", **bar, "factor": 0.8}, {"id": "at_02", "text": "t", **bar, "factor": 0.2})
    v = {x.claim.id: x for x in claims.evaluate_claims("toy", "tiny", root)}
    # increases 4, 6, 5 against 0.8 x (10, 11, 9) = 8, 8.8, 7.2: d = -4, -2.8, -2.2
    assert v["at_08"].diff.mean == pytest.approx((-4 - 2.8 - 2.2) / 3) and v["at_08"].status == HOLDS
    assert v["at_02"].status == FAILS  # 0.2 x (10, 11, 9) = 2, 2.2, 1.8 < 4, 6, 5
    claims.write_verdicts("toy", "tiny", root)
    assert claims.check_readme("toy", "tiny") == []
    assert "0.8 x (rhs - over)" in (exp_dir / "README.md").read_text()
    declare({"id": "bad", "text": "t", **bar, "over": side("drrqr")})
    with pytest.raises(ClaimError, match="`over` must be one deterministic value"):
        claims.evaluate_claims("toy", "tiny", root)
    declare({"id": "no_over", "text": "t", "lhs": side("ours"), "op": "<", "rhs": side("drrqr"), "factor": 0.8})
    with pytest.raises(ClaimError, match="factor scales the rhs increase over `over`, which is missing"):
        claims.load_claims("toy")


def test_every_experiment_readme_has_a_generated_verdict_block():
    """Issue 15: every experiment folder declares claims, so that its README carries a generated verdict block."""
    folders = sorted(p.parent.name for p in claims.EXPERIMENTS_DIR.glob("*/README.md"))
    assert folders and sorted(set(folders) - set(claims.experiments_with_claims())) == []
    for name in folders:
        assert claims.current_block(name) is not None, f"experiments/{name}/README.md has no verdict block"


def _bench(root, name, rows, kind="bench"):
    r = build_result(kind, profile="tiny", experiment="toy", config={"mode": "decode", "model": "m"},
                     metrics={"speedup_r50": 2.0}, model=None, data={}, seeds={}, wall_time_s=0.0,
                     extra={"rows": rows})
    write_result(root / "tiny" / "toy" / f"{name}.json", r)


def test_repetition_rows_pair_each_repetition_with_the_base_row_at_its_place(experiment, tmp_path):
    """`claim_rows: {from: repetitions}`: one row per timed repetition, with its paired ratio to the base row of
    the same batch and repetition; a claim on sample_ms paired by repetition tests the speedup."""
    _, _, exp_dir = experiment
    root = tmp_path / "bench"
    rows = [{"batch": b, "label": label, "ratio": ratio, "samples_ms": samples}
            for b, per in ((1, {"base": [10.0, 12.0, 11.0], "r50": [9.9, 12.1, 10.9]}),
                           (64, {"base": [40.0, 44.0, 42.0], "r50": [20.0, 23.0, 21.0]}))
            for (label, samples), ratio in zip(per.items(), (0.0, 0.5))]
    _bench(root, "decode_m_cpu", rows)
    side = (lambda b, r: {"kind": "bench", "where": {"batch": b, "ratio": r}, "metric": "sample_ms"})
    config = {"experiment": "toy", "claim_rows": {"from": "repetitions"}, "claims": [
        {"id": "faster_b64", "text": "t", "lhs": side(64, 0.5), "op": "<", "rhs": side(64, 0.0), "pair_by": "rep"},
        {"id": "faster_b1", "text": "t", "lhs": side(1, 0.5), "op": "<", "rhs": side(1, 0.0), "pair_by": "rep"},
        {"id": "ratio_b64", "text": "t", "lhs": {"kind": "bench", "where": {"batch": 64, "ratio": 0.5},
                                                  "metric": "speedup_rep"}, "op": ">", "rhs": 1.5}]}
    (exp_dir / "config.yaml").write_text(yaml.safe_dump(config))
    got = claims.claim_rows("tiny", "toy", root)
    assert len(got) == 12 and {r["rep"] for r in got} == {0, 1, 2}
    r = next(r for r in got if r["batch"] == 64 and r["label"] == "r50" and r["rep"] == 1)
    assert r["sample_ms"] == 23.0 and r["speedup_rep"] == pytest.approx(44.0 / 23.0) and r["mode"] == "decode"
    assert "samples_ms" not in r  # the list is the rows, not a field
    verdicts = {v.claim.id: v.status for v in claims.evaluate_claims("toy", "tiny", root)}
    assert verdicts == {"faster_b64": HOLDS, "faster_b1": INCONCLUSIVE, "ratio_b64": HOLDS}


def test_extra_rows_from_a_committed_folder_and_bad_sources(experiment, tmp_path):
    """`claim_rows: {from: extra_rows, dir: ...}` (the rehearsal): one row per entry of each committed result's
    extra.rows; a misnamed source or key, or a missing folder, is an error naming the config."""
    _, _, exp_dir = experiment
    committed = exp_dir / "results"
    for model, offs in (("a", [0.1, -0.05]), ("b", [0.02, 0.03])):
        rows = [{"model": model, "stage": "prune", "predicted_off": o, "ok": True} for o in offs]
        r = build_result("bench", profile="paper" if model == "b" else "tiny", experiment="rehearsal",
                         config={"layers": 2}, metrics={}, model=None, data={}, seeds={}, wall_time_s=0.0,
                         extra={"rows": rows + [{"stage": "build"}]})
        write_result(committed / f"rehearsal-{model}.json", r)
    rel = committed.relative_to(claims.REPO_ROOT) if committed.is_relative_to(claims.REPO_ROOT) else committed
    config = {"experiment": "toy", "claim_rows": {"from": "extra_rows", "dir": str(rel)}, "claims": [
        {"id": "plan_close", "text": "t", "lhs": {"kind": "bench", "where": {"stage": "prune"},
                                                   "metric": "predicted_off"}, "op": "<", "rhs": 0.25}]}
    (exp_dir / "config.yaml").write_text(yaml.safe_dump(config))
    rows = claims.claim_rows("tiny", "toy")  # a committed folder's results of the asked profile only
    assert [r["_file"] for r in rows] == ["rehearsal-a.json#0", "rehearsal-a.json#1", "rehearsal-a.json#2"]
    assert rows[0]["layers"] == 2 and rows[0]["predicted_off"] == 0.1 and rows[2]["stage"] == "build"
    assert [r["model"] for r in claims.claim_rows("paper", "toy") if "model" in r] == ["b", "b"]
    [v] = claims.evaluate_claims("toy", "paper")
    assert v.status == HOLDS and len(v.samples["lhs"]) == 2
    for bad, message in (({"from": "resluts"}, "'results'"), ({"from": "results", "folder": "x"}, "`from` and `dir`"),
                         ({"from": "extra_rows", "dir": "no/such/folder"}, "is not a folder")):
        (exp_dir / "config.yaml").write_text(yaml.safe_dump({**config, "claim_rows": bad}))
        with pytest.raises(ClaimError, match="claim_rows") as e:
            claims.claim_rows("tiny", "toy")
        assert message in str(e.value) and "config.yaml" in str(e.value)


def test_training_record_rows_read_the_committed_records_of_the_tiny_profile_only(experiment):
    _, _, exp_dir = experiment
    for name, acc in (("m_s0", 0.95), ("m_s1", 0.97)):
        folder = exp_dir / "checkpoints" / name
        folder.mkdir(parents=True)
        (folder / "training_record.json").write_text(json.dumps({
            "name": name, "family": "deltanet", "config": {"seed": int(name[-1])},
            "eval": {"mqar": {"pairs_8": {"accuracy": acc, "queries": 2048}}},
            "provenance": {"git_commit": "x"}, "data": {"ptb": {"sha256": "y"}}}))
    config = {"experiment": "toy", "claim_rows": {"from": "training_records"}}
    (exp_dir / "config.yaml").write_text(yaml.safe_dump(config))
    rows = claims.claim_rows("tiny", "toy")
    assert [r["name"] for r in rows] == ["m_s0", "m_s1"] and rows[1]["eval.mqar.pairs_8.accuracy"] == 0.97
    assert rows[0]["kind"] == "pretrain" and rows[0]["config.seed"] == 0
    assert not any(k.startswith(("provenance", "data")) for k in rows[0])
    assert claims.claim_rows("paper", "toy") == []


def test_group_by_takes_one_sample_per_model_and_pairs_the_sides_on_it(experiment, tmp_path):
    """group_by: model: each pretraining seed's mean over its calibration seeds is one sample (n = models, not rows),
    the two sides pair on the model; the evidence re-derives the same verdict; bad uses name the claim."""
    declare, _, exp_dir = experiment
    root = tmp_path / "grouped"
    # three models (pretraining seeds) with dense recall 0.95 / 0.99 / 0.90, pruned cells 3 calibration seeds each
    pruned = {"m0": [0.50, 0.52, 0.54], "m1": [0.60, 0.58, 0.62], "m2": [0.40, 0.45, 0.35]}
    dense = {"m0": 0.95, "m1": 0.99, "m2": 0.90}
    for model, values in pruned.items():
        for seed, v in enumerate(values):
            write_result(root / "tiny" / "toy" / f"{model}-{seed}.json",
                         build_result("evaluate", profile="tiny", experiment="toy",
                                      config={"model": model, "method": "drrqr", "vary": {"seed": seed}},
                                      metrics={"acc": v}, model=None, data={}, seeds={}, wall_time_s=0.0))
        write_result(root / "tiny" / "toy" / f"{model}-dense.json",
                     build_result("evaluate", profile="tiny", experiment="toy",
                                  config={"model": model, "method": "baseline"},
                                  metrics={"acc": dense[model]}, model=None, data={}, seeds={}, wall_time_s=0.0))
    side = (lambda m: {"kind": "evaluate", "where": {"model": ["m0", "m1", "m2"], "method": m}, "metric": "acc"})
    declare({"id": "falls", "text": "t", "lhs": side("drrqr"), "op": "<", "rhs": side("baseline"), "group_by": "model"})
    (v,) = claims.evaluate_claims("toy", "tiny", root)
    assert v.lhs.n == 3 and v.diff.n == 3  # three models, not nine rows
    assert v.lhs.mean == pytest.approx((0.52 + 0.60 + 0.40) / 3)
    assert v.diff.mean == pytest.approx((0.52 - 0.95 + 0.60 - 0.99 + 0.40 - 0.90) / 3)
    assert v.status == HOLDS
    assert sorted(k for k, _ in v.samples["lhs"]) == ["m0", "m1", "m2"]
    assert dict(v.samples["rhs"]) == dense
    claims.write_verdicts("toy", "tiny", root)
    (again,) = claims.verdicts_from_evidence("toy", "tiny")
    assert again.status == v.status and again.diff.mean == pytest.approx(v.diff.mean)
    assert claims.check_readme("toy", "tiny") == []
    readme = (exp_dir / "README.md").read_text()
    assert "acc < rhs; one sample per model)" in readme and "a claim with group_by has one sample per value" in readme
    # a side naming two of the three models: the pairs are the models on both sides
    declare({"id": "falls", "text": "t", "lhs": {**side("drrqr"), "where": {"model": ["m0", "m1"], "method": "drrqr"}},
             "op": "<", "rhs": side("baseline"), "group_by": "model"})
    (two,) = claims.evaluate_claims("toy", "tiny", root)
    assert two.diff.n == 2
    # a model the side names without results (one table of several run here): no verdict on a subset; --keep keeps the
    # committed evidence, and the summary counts the claim as one without results
    declare({"id": "falls", "text": "t", "lhs": side("drrqr"), "op": "<", "rhs": side("baseline"), "group_by": "model"})
    claims.write_verdicts("toy", "tiny", root)
    for f in (root / "tiny" / "toy").glob("m2-*.json"):
        f.unlink()
    with pytest.raises(claims.NoResultError, match="claim 'falls'.* no result for model m2 .of m0, m1, m2."):
        claims.evaluate_claims("toy", "tiny", root)
    (kept,) = claims.evaluate_claims("toy", "tiny", root, keep=True)
    assert kept.diff.n == 3 and kept.diff.mean == pytest.approx(v.diff.mean)
    assert any("1 of 1 claims have no results here" in ln for ln in claims.render_summary("toy", "tiny", root))
    for bad, match in (({"group_by": ["model"]}, "group_by must be one field name"),
                       ({"group_by": "model", "pair_by": "seed"}, "cannot pair them on another field"),
                       ({"group_by": "model", "rhs_fixed": True}, "rhs_fixed and over"),
                       ({"group_by": "pretraining"}, "no result has the field 'pretraining'")):
        declare({"id": "bad", "text": "t", "lhs": side("drrqr"), "op": "<", "rhs": side("baseline"), **bad})
        with pytest.raises(ClaimError, match=f"claim 'bad'.*{match}"):
            claims.evaluate_claims("toy", "tiny", root)


def test_stale_results_stop_the_verdicts_and_are_said_in_the_render_summary(experiment, monkeypatch):
    """A pipeline experiment (one with tables) whose results hold a file its config no longer gives: the verdicts
    refuse to mix recipes, naming the file and the table to rerun; the render summary says so and still decides.
    (pipeline.stages.stale_results itself: tests/test_pipeline.py.)"""
    from state_reduction.pipeline import stages

    declare, root, exp_dir = experiment
    declare(_claim("drrqr_beats_l1", "drrqr", "<", "l1", pair_by="seed"))
    assert claims.stale_files("toy", "tiny", root) == []  # no tables: not a pipeline experiment, never judged
    config = yaml.safe_load((exp_dir / "config.yaml").read_text())
    (exp_dir / "config.yaml").write_text(yaml.safe_dump({**config, "tables": {"t1": {}}}))
    found = []
    monkeypatch.setattr(stages, "stale_results", lambda *a: found)
    assert claims.evaluate_claims("toy", "tiny", root)[0].status == HOLDS
    found.append(("drrqr-1", "aaaa", "bbbb", "t1"))
    with pytest.raises(ClaimError, match=r"1 result file\(s\) .* drrqr-1.json: key aaaa, the config's bbbb.*"
                                         r"run-table TABLE --profile tiny`: t1\)"):
        claims.evaluate_claims("toy", "tiny", root)
    lines = claims.render_summary("toy", "tiny", root)
    assert lines[1].startswith("- STALE RESULTS: claims of 'toy'") and "holds  drrqr_beats_l1" in lines[2]

    def cannot_plan(*a):
        raise ClaimError("no checkpoint folder x")
    monkeypatch.setattr(stages, "stale_results", cannot_plan)  # the summary says so and still decides
    lines = claims.render_summary("toy", "tiny", root)
    assert lines[1] == "- stale-result check not run: no checkpoint folder x" and "holds  drrqr_beats_l1" in lines[2]
