"""`state-reduction analyze` end to end on the tiny Gated DeltaNet, and its errors on bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import state_reduction  # noqa: F401  (registers the families)
from state_reduction.analysis.analyze import AnalyzeConfig, analyze
from state_reduction.analysis.rank import spectral_gap
from state_reduction.analysis.selection import median
from state_reduction.cli import main
from state_reduction.pruning.prune import PruneConfig, prune
from state_reduction.results import read_result

CHECKPOINTS = Path(__file__).resolve().parents[2] / "experiments" / "tiny_models" / "checkpoints"
GDN = str(CHECKPOINTS / "gated_deltanet")
SMALL = ["--n-calib", "2", "--seq-len", "64", "--stride", "16", "--threads", "1"]


@pytest.fixture(scope="module")
def pruned(tmp_path_factory):
    root = tmp_path_factory.mktemp("pruned")
    out = {}
    for model, method in (("gated_deltanet", "drrqr"), ("gated_deltanet", "rand"), ("deltanet", "rand")):
        out[model, method] = root / f"{model}-{method}"
        prune(PruneConfig(model=str(CHECKPOINTS / model), method=method, ratio=0.5, n_calib=4, seq_len=64,
                          out=str(out[model, method])))
    return out


def _no_nan(path: Path) -> dict:
    def refuse(constant):
        raise AssertionError(f"{path} holds {constant}")
    return json.loads(path.read_text(), parse_constant=refuse)


def test_analyze_dense_selection_and_overlap(tmp_path, pruned, capsys):
    out = tmp_path / "gdn.json"
    assert main(["analyze", GDN, "--selection", str(pruned["gated_deltanet", "drrqr"]),
                 "--compare", str(pruned["gated_deltanet", "rand"] / "selection.json"), "--out", str(out), *SMALL]) == 0
    assert "overlap" in capsys.readouterr().out
    record = read_result(out)
    _no_nan(out)
    m, extra = record["metrics"], record["extra"]
    assert record["kind"] == "analyze" and extra["decay"] and extra["divisor"] == "dk"
    assert set(m["u_per_layer"]) == {"0", "1", "2", "3"} and all(0 < u <= 1 for u in m["u_per_layer"].values())
    heads = extra["dense"]["states"]["0"]["heads"]
    assert len(heads) == 2 and len(heads[0]["spectrum"]) == 64 and heads[0]["spectrum"][0] == pytest.approx(1.0)
    # Table 6: by interlacing, a subset of the columns is never worse conditioned than all 64
    assert m["selection_kappa_median"] <= m["kappa_median_dense"]
    assert m["selection_sigma_max_median"] <= m["sigma_max_median_dense"] + 1e-12
    assert m["sigma_min_median_dense"] == extra["dense"]["conditioning"]["median"]["sigma_min"]
    spread = extra["utilization_summary"]["dense"]
    assert m["u_max_over_min"] == pytest.approx(spread["max"] / spread["min"]) and m["u_max_over_min"] >= 1
    assert extra["selection"]["states"]["0"]["d_k"] == 32 and -1 <= m["selection_pearson_u"] <= 1
    assert 0 <= m["overlap_median"] <= 32 and extra["overlap"]["kept"] == [32, 32]
    assert set(extra["conv_similarity"]["0"]) == {"q", "k"}
    within = [c for layer in extra["conv_similarity"].values() for f in layer.values() for c in f["within_head"]]
    assert m["conv_within_head_cosine"] == pytest.approx(sum(within) / len(within))
    assert -1 <= m["conv_across_heads_cosine"] <= 1
    # Figures 5, 6: the gap among the reduced state's 32 values, and the dense one's among its first 32
    gaps = [spectral_gap(h["spectrum"])[0] for s in extra["selection"]["states"].values() for h in s["heads"]]
    assert m["selection_spectral_gap_median"] == pytest.approx(median(gaps)) and m["compare_spectral_gap_median"] >= 1
    dense32 = [spectral_gap(h["spectrum"], 32)[0] for s in extra["dense"]["states"].values() for h in s["heads"]]
    assert m["dense_spectral_gap_median"] == pytest.approx(median(dense32))


def test_gdn_decay_changes_the_models_utilisation(pruned):
    base = AnalyzeConfig(model=GDN, n_calib=1, seq_len=64, stride=32)
    with_decay = analyze(base)["metrics"]["u_mean"]
    without = analyze(AnalyzeConfig(**{**base.__dict__, "ignore_decay": True}))["metrics"]["u_mean"]
    assert with_decay != pytest.approx(without, rel=1e-3)


def test_model_without_recurrent_layers_is_named(tmp_path, capsys):
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path / "llama"
    LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                 num_key_value_heads=1, vocab_size=50)).save_pretrained(path)
    assert main(["analyze", str(path), "--out", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert "'llama'" in err and "recurrent" in err


def test_selection_of_another_model_names_both(tmp_path, pruned, capsys):
    other = pruned["deltanet", "rand"]
    assert main(["analyze", GDN, "--selection", str(other), "--out", str(tmp_path / "o.json"), *SMALL]) == 2
    err = capsys.readouterr().err
    assert str(other) in err and GDN in err and "delta_net" in err and "gated_deltanet" in err
    # same family, one layer fewer
    record = json.loads((pruned["gated_deltanet", "rand"] / "selection.json").read_text())
    del record["selection"]["3"]
    short = tmp_path / "short.json"
    short.write_text(json.dumps(record))
    assert main(["analyze", GDN, "--selection", str(short), "--out", str(tmp_path / "o.json"), *SMALL]) == 2
    err = capsys.readouterr().err
    assert str(short) in err and "3 layers" in err and "4 reducible layers" in err


def test_degenerate_head_is_flagged_not_nan(tmp_path):
    """Head 0 of layer 0 with all-zero q/k activations: its state stays zero."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(GDN)
    mixer = model.model.layers[0].attn
    with torch.no_grad():
        for proj in (mixer.q_proj, mixer.k_proj):
            proj.weight[:mixer.head_k_dim] = 0
    path = tmp_path / "dead"
    model.save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(CHECKPOINTS / "gated_deltanet" / name, path / name)
    record = analyze(AnalyzeConfig(model=str(path), n_calib=1, seq_len=32, stride=16))
    out = tmp_path / "dead.json"
    out.write_text(json.dumps(record, allow_nan=False))
    head = record["extra"]["dense"]["states"]["0"]["heads"][0]
    assert head["degenerate"] and head["u"] is None and head["n_states"] == 0
    assert record["extra"]["dense"]["states"]["0"]["degenerate_heads"] == [0]
    assert record["metrics"]["degenerate_heads"] == 1
    assert record["extra"]["dense"]["conditioning"]["per_layer"]["0"][0]["degenerate"]
    assert record["metrics"]["u_per_layer"]["0"] is not None  # the other head still counts


def test_selection_model_must_keep_what_the_selection_keeps(tmp_path, pruned, capsys):
    """--selection-model (e.g. the model after RFT) is analysed for the selection; the dense model does not fit."""
    sel = str(pruned["gated_deltanet", "drrqr"])
    out = tmp_path / "o.json"
    assert main(["analyze", GDN, "--selection", sel, "--selection-model", sel, "--out", str(out), *SMALL]) == 0
    extra = read_result(out)["extra"]
    assert extra["selection"]["model_dir"] == sel and extra["selection"]["states"]["0"]["d_k"] == 32
    heads = extra["dense"]["states"]["0"]["heads"]
    assert extra["dense"]["states"]["0"]["positions"] == [16, 32, 48, 64]
    assert all(len(h["u_by_position"]) == 4 and h["u_by_position"][-1] is not None for h in heads)
    assert main(["analyze", GDN, "--selection", sel, "--selection-model", GDN, "--out", str(out), *SMALL]) == 2
    err = capsys.readouterr().err
    assert GDN in err and "selection.json" in err and "2 key heads x 64" in err and "keeps 2 x 32" in err
    # without --selection the model is analysed at full width (the dense+RFT control): a pruned one does not fit
    assert main(["analyze", GDN, "--selection-model", sel, "--out", str(out), *SMALL]) == 2
    err = capsys.readouterr().err
    assert f"model {sel} has 2 key heads x 32 channels" in err and "keeps 2 x 64" in err and "every key channel" in err


def test_a_full_width_model_analysed_beside_itself_is_the_dense_model(tmp_path):
    """The control's analysis (--selection-model without --selection, every channel kept) of the dense model itself:
    the same states, so the same u, rho 1 with the baseline, the same spectral gap among d_k values and the same
    conditioning."""
    out = tmp_path / "o.json"
    assert main(["analyze", GDN, "--selection-model", GDN, "--out", str(out), *SMALL]) == 0
    record = read_result(out)
    m, sel = record["metrics"], record["extra"]["selection"]
    assert sel["kept"] == 64 and sel["model_dir"] == GDN and sel["method"] is None
    assert m["selection_u_mean"] == pytest.approx(m["u_mean"], rel=1e-12)
    assert m["selection_pearson_u"] == pytest.approx(1.0, abs=1e-9)
    assert m["selection_spectral_gap_median"] == pytest.approx(m["dense_spectral_gap_median"], rel=1e-12)
    for k in ("kappa", "sigma_min", "sigma_max"):
        assert m[f"selection_{k}_median"] == pytest.approx(m[f"{k}_median_dense"], rel=1e-9)
