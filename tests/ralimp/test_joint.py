"""Issue 18 part 3-4 code paths: method names of the pipeline's linearize stage, k = all, the local distillation to
the dense MLP, deployed costs, the linearize CLI's one-line errors (the issue's "Must show" bad inputs), and one
joint cell (DRRQR 50% + RaLiMP on the last MLP) through the pipeline on a committed tiny checkpoint."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import state_reduction  # noqa: F401  (registers the families and their _ralimp variants)
from state_reduction.models import build_model
from state_reduction.pruning.shed import structure_costs
from state_reduction.ralimp.errors import RalimpError
from state_reduction.ralimp.gated import GatedLinearization, gated_weights
from state_reduction.ralimp.linearize import (
    LinearizeMethod,
    deployed,
    linearized_costs,
    main,
    parse_linearize_method,
    to_variant,
)
from state_reduction.ralimp.model import LinearizedMLP, decoder_layers, fit_to_dense, replace_last_mlps

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

CHECKPOINTS = Path(__file__).resolve().parents[2] / "experiments" / "tiny_models" / "checkpoints"

GDN = {"hidden_size": 32, "num_hidden_layers": 3, "num_heads": 2, "head_dim": 16, "vocab_size": 61,
       "fuse_cross_entropy": False, "fuse_swiglu": False, "hidden_ratio": 2}
SPEC = {"method": "ralimp", "budget": 32, "rank": 16, "sphere": True, "clamp": 10.0}


def _gdn():
    return build_model("gated_deltanet", GDN, seed=0).eval()


def _ids(seed=0, n=4, t=16):
    return torch.randint(0, 61, (n, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name,parsed", [
    ("ralimp-k1", LinearizeMethod("ralimp", 1)),
    ("eugen-kall", LinearizeMethod("eugen", "all")),
    ("drrqr+snnk-k12", LinearizeMethod("snnk", 12, "drrqr")),
    ("drrqr", None), ("shed-mixer+drrqr", None), ("ralimp", None), ("gelu-k1", None), ("ralimp-kx", None),
])
def test_method_names(name, parsed):
    from state_reduction.pipeline import prune_kind

    assert parse_linearize_method(name) == parsed
    want = "linearize" if parsed else ("shed" if name.startswith("shed") else "prune")
    assert prune_kind(name) == want


def test_k_all_replaces_every_layer():
    model = _gdn()
    assert replace_last_mlps(model, "all", _ids(), **SPEC) == [0, 1, 2]
    assert all(isinstance(layer.mlp, LinearizedMLP) for layer in decoder_layers(model))
    with pytest.raises(RalimpError, match=r"replace_layers='every' .* \(accepted: 1..3 or 'all'\)"):
        replace_last_mlps(_gdn(), "every", _ids(), **SPEC)


def test_local_fit_lowers_the_error_to_the_dense_mlp():
    torch.manual_seed(0)
    mlp = decoder_layers(_gdn())[2].mlp
    g, u, d = (w.detach() for w in gated_weights(mlp))
    x = torch.randn(256, 32)
    with torch.no_grad():
        y = mlp(x)
    gated = GatedLinearization(g, u, d, rank=16, budget=32, calib_t=(x @ g.T).flatten()[:500], sphere=True,
                               clamp=10.0, x_rms=float(x.norm(dim=-1).pow(2).mean().sqrt()))
    frozen = {n: b.clone() for n, b in gated.named_buffers()}
    none = fit_to_dense(gated, x, y, steps=0)
    assert none["rel_error_fit"] == none["rel_error_init"]
    fit = fit_to_dense(gated, x, y, steps=60, lr=3e-3, batch_size=128)
    assert fit["rel_error_init"] == pytest.approx(none["rel_error_init"])
    assert fit["rel_error_fit"] < 0.5 * fit["rel_error_init"]
    assert all(torch.equal(b, frozen[n]) for n, b in gated.named_buffers())  # projections and sketch stay frozen
    with pytest.raises(RalimpError, match="fit_steps must be an integer >= 0, got -1"):
        fit_to_dense(gated, x, y, steps=-1)


def test_replace_reports_the_fit_per_layer():
    report = {}
    replace_last_mlps(_gdn(), 2, _ids(), fit_steps=5, report=report, **SPEC)
    assert sorted(report) == [1, 2] and all(set(r) == {"rel_error_init", "rel_error_fit"} for r in report.values())


def test_deployed_costs_count_the_folded_mlps():
    dense = _gdn()
    model = _gdn()
    idx = replace_last_mlps(model, 2, _ids(), **SPEC)
    variant = to_variant(model, idx, SPEC).eval()
    inference = deployed(variant).eval()
    with torch.no_grad():
        torch.testing.assert_close(inference(input_ids=_ids(1)).logits, variant(input_ids=_ids(1)).logits,
                                   rtol=1e-4, atol=1e-4)
    before, after = structure_costs(dense), linearized_costs(inference)
    layers = decoder_layers(dense)
    mlp_params = sum(p.numel() for i in idx for p in layers[i].mlp.parameters())
    folded = [decoder_layers(inference)[i].mlp.folded for i in idx]
    assert after["parameters"] == before["parameters"] - mlp_params + sum(f.deployed_parameters() for f in folded)
    mlp_flops = sum(2 * sum(m.weight.numel() for m in layers[i].mlp.modules() if isinstance(m, torch.nn.Linear))
                    for i in idx)
    assert after["flops_per_token"] == before["flops_per_token"] - mlp_flops + sum(f.flops_per_token() for f in folded)
    assert after["state_bytes"] == before["state_bytes"]


def _cli(tmp_path, capsys, model, *args):
    rc = main(["--model", str(CHECKPOINTS / model), "--out", str(tmp_path / "o"), "--n-calib", "2", "--seq-len", "16",
               "--fit-steps", "0", "--no-decode", *args])
    err = [line.rsplit("\r", 1)[-1] for line in capsys.readouterr().err.splitlines()]
    return rc, [line for line in err if "error" in line], err


@pytest.mark.parametrize("model,args,message", [
    ("gated_deltanet", ["--k", "1", "--budget", "12"],
     "ralimp: budget 12 leaves 4 rational features after poly_features 8; need a positive multiple of 2 x n_freq = 6 "
     "(budget >= 14)"),
    ("gated_deltanet", ["--k", "1", "--tau", "0"], "ralimp: tau must be a finite number > 0, got 0.0"),
    ("gated_deltanet", ["--k", "1", "--tau", "-1"], "ralimp: tau must be a finite number > 0, got -1.0"),
    ("deltanet", ["--k", "5"], "ralimp: replace_layers=5 but DeltaNetForCausalLM has 4 decoder layers "
                               "(accepted: 1..4 or 'all')"),
    ("mamba2", ["--k", "1"], "ralimp: gated form requested but layer 5 of Mamba2ForCausalLM has no MLP"),
    ("gated_deltanet", ["--k", "1", "--method", "eugen", "--tau", "1"], "method 'eugen' has no option 'tau'"),
])
def test_cli_bad_input_is_one_line(tmp_path, capsys, model, args, message):
    rc, errors, err = _cli(tmp_path, capsys, model, *args)
    assert rc == 2
    assert len(errors) == 1 and errors[0].startswith("ralimp.linearize: error: ") and message in errors[0]
    assert not any("Traceback" in line for line in err)
    assert not (tmp_path / "o").exists()


def test_non_gated_mlp_where_the_gated_form_is_requested():
    model = _gdn()
    decoder_layers(model)[2].mlp.hidden_act = "gelu"
    with pytest.raises(RalimpError, match=r"layer 2 mlp has hidden_act='gelu' \(accepted: swish, silu\)"):
        replace_last_mlps(model, 1, _ids(), **SPEC)


def test_joint_cell_through_the_pipeline(tmp_path):
    """DRRQR 50% then RaLiMP on the last MLP: the key dimension halves, the state bytes halve, the parameters
    fall by the replaced MLP less its deployed size, decode is timed beside the dense model, and the checkpoint
    reloads with AutoModelForCausalLM as the RaLiMP variant of the pruned model."""
    from state_reduction.pipeline import run_table
    from state_reduction.results import read_result

    config = tmp_path / "joint.yaml"
    config.write_text(textwrap.dedent(f"""
        experiment: joint_test
        methods: [drrqr, drrqr+ralimp-k1]
        profiles:
          tiny:
            models:
              gdn: {{path: {CHECKPOINTS / 'gated_deltanet'}, stands_for: [GDN]}}
            prune: {{calib: ptb, n_calib: 2, seq_len: 32, seed: 0, costs: true,
                    decode: {{prompt_len: 4, warmup: 1, steps: 2, repeats: 2}},
                    linearize: {{budget: 32, rank: 16, fit_steps: 3}}}}
            evaluate: {{suite: tiny_wiki, batch_size: 8, max_length: 64, limit: 1}}
        tables:
          t: {{models: [GDN], methods: [drrqr+ralimp-k1], ratios: [0.5], rft: [false]}}
        """))
    paths = run_table(str(config), "t", "tiny", results_root=tmp_path / "results", stages=("prune",))
    (result,) = [read_result(p) for p in paths]
    m = result["metrics"]
    assert result["kind"] == "prune" and result["extra"]["replaced_layers"] == [3]
    assert m["key_dim_after"] == m["key_dim_before"] // 2
    assert m["state_bytes_after"] == m["state_bytes_before"] // 2
    assert m["parameters_after"] < m["parameters_before"] and m["flops_per_token_after"] < m["flops_per_token_before"]
    assert m["decode_ms_per_token"] > 0 and m["decode_ms_per_token_dense"] > 0
    assert m["mlp_rel_error_fit"] <= m["mlp_rel_error_init"] * 1.5
    model = AutoModelForCausalLM.from_pretrained(result["model"]["path"])
    assert model.config.model_type == "gated_deltanet_ralimp" and model.config.ralimp_layers == [3]
    pruned = AutoModelForCausalLM.from_pretrained(result["extra"]["source_model"])
    assert model.config.head_dim == pruned.config.head_dim == m["key_dim_after"] \
        or getattr(model.config, "head_k_dim", None) == m["key_dim_after"]
    assert structure_costs(pruned)["state_bytes"] == m["state_bytes_after"]


@pytest.mark.slow  # a fresh interpreter imports the whole stack: 17 s idle, ~3 min on the loaded two-core machine
def test_mlp_only_cell_in_a_fresh_process(tmp_path):
    """A linearize cell with no selector (nothing else in the process installs the CPU backend first) runs: the
    first full run failed there with Triton's "0 active drivers"."""
    import json
    import os
    import subprocess
    import sys

    config = tmp_path / "mlp.yaml"
    config.write_text(textwrap.dedent(f"""
        experiment: mlp_test
        methods: [eugen-k1]
        profiles:
          tiny:
            models:
              dn: {{path: {CHECKPOINTS / 'deltanet'}, stands_for: [DN]}}
            prune: {{calib: ptb, n_calib: 2, seq_len: 16, seed: 0, linearize: {{budget: 8, rank: 8, fit_steps: 2}}}}
            evaluate: {{suite: tiny_wiki, batch_size: 8, max_length: 64, limit: 1}}
        tables:
          t: {{models: [DN], ratios: [0.0], rft: [false]}}
        """))
    code = (f"from state_reduction.pipeline import run_table; import json; "
            f"print(json.dumps([str(p) for p in run_table({str(config)!r}, 't', 'tiny', "
            f"results_root={str(tmp_path / 'r')!r}, stages=('prune',))]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    (path,) = json.loads(out.stdout.strip().splitlines()[-1])
    result = json.loads(Path(path).read_text())
    assert result["extra"]["replaced_layers"] == [3] and result["extra"]["ralimp"]["method"] == "eugen"


def test_paper_plan_dry_runs():
    from state_reduction.pipeline import plan_table

    for table in ("joint_paper_state", "joint_paper_mlp", "joint_paper_both"):
        plan = plan_table("joint_compression", table, "paper")
        assert set(plan["models"]) == {"gated_deltanet-1.3b"}
        assert plan["rft"] == [False, True]
        assert all(c["linearize"]["budget"] == 672 for _, c in plan["stages"]["prune"])
    methods = {c["method"] for t in ("joint_paper_mlp", "joint_paper_both")
               for _, c in plan_table("joint_compression", t, "paper")["stages"]["prune"]}
    assert methods == {"ralimp-k1", "ralimp-k2", "ralimp-kall", "eugen-kall", "snnk-kall", "drrqr+ralimp-k1",
                       "drrqr+ralimp-k2", "drrqr+ralimp-kall"}
