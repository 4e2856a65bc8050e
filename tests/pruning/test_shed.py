"""Structure removal (Mamba-Shedder): masking == surgery for every candidate type and family, exact reload with
AutoModelForCausalLM, costs, the limits, greedy search == brute force, resume after SIGKILL, one-shot."""

from __future__ import annotations

import copy
import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import state_reduction  # noqa: F401  (registers the families and their _shed variants)
from state_reduction.models import build_model
from state_reduction.models.shed import ZeroMixer, ZeroMLP
from state_reduction.models.families import get_adapter
from state_reduction.pruning.shed import (
    Candidate,
    Scorer,
    candidates,
    check_steps,
    masked,
    remove_structures,
    search,
    structure_costs,
)

from state_reduction.models.families import FAMILIES

GROUP = 32
VOCAB = 97
# the families' tiny float64 test models (fla's MLP width: 256 for hidden 64, Qwen3.5's 128), with three blocks,
# for every family with a structure-removal variant
CONFIGS = {name: {**f.test_config, "vocab_size": VOCAB, "num_hidden_layers": 3} for name, f in FAMILIES.items() if f.shed}
# Masked and reduced models run the same operations but for the narrower MLP matmuls (other summation order).
ATOL = 1e-12
REMOVALS = {  # per target, a removal set that touches several layers (and, for the hybrid, its attention layer)
    "block": ["block:0", "block:1"],
    "mixer": ["mixer:1", "mixer:2"],
    "mlp": ["mlp:0", "mlp:2"],
    "mlp-channels": ["mlp-channels:0:0", "mlp-channels:0:2", "mlp-channels:2:1"],
}
CASES = [(f, t) for f in CONFIGS for t in REMOVALS if not (FAMILIES[f].adapter.structure.mlp is None and t.startswith("mlp"))]

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def tiny(family: str, seed: int = 0):
    return build_model(family, CONFIGS[family], seed=seed, dtype=torch.float64).eval()


def tokens(seed: int = 0, n: int = 2, length: int = 20) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, length), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def logits(model, ids) -> torch.Tensor:
    return model(ids, use_cache=False).logits


@pytest.mark.parametrize("family,target", CASES)
def test_masked_equals_surgery_and_reload_is_exact(family, target, tmp_path):
    model, ids = tiny(family), tokens()
    removed = [Candidate.parse(n) for n in REMOVALS[target]]
    dense = logits(model, ids)
    with masked(model, removed, GROUP):
        want = logits(model, ids)
    assert torch.equal(logits(model, ids), dense)  # the hooks are gone
    assert (want - dense).abs().max() > 1e-3  # the removal changes the model
    before = structure_costs(model)
    remove_structures(model, removed, GROUP)
    got = logits(model, ids)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64).eval()
    assert type(reloaded) is type(model)
    assert torch.equal(logits(reloaded, ids), got)
    after = structure_costs(reloaded)
    assert after == structure_costs(model)
    assert after["parameters"] < before["parameters"] and after["flops_per_token"] < before["flops_per_token"]
    layout = get_adapter(reloaded).structure
    blocks = layout.blocks(reloaded)
    if target == "block":
        assert reloaded.config.model_type == model.config.model_type == get_adapter(tiny(family)).model_type
        assert len(blocks) == reloaded.config.num_hidden_layers == 1
    else:
        assert reloaded.config.model_type.endswith("_shed")
    if target == "mixer":
        assert reloaded.config.shed_removed_mixers == [1, 2]
        assert all(isinstance(getattr(blocks[i], layout.mixer_name(blocks[i])), ZeroMixer) for i in (1, 2))
    if target == "mlp":
        assert reloaded.config.shed_removed_mlps == [0, 2] and isinstance(blocks[0].mlp, ZeroMLP)
    if target == "mlp-channels":
        width = getattr(tiny(family).get_submodule(layout.layers)[1].mlp, layout.mlp_up).out_features
        assert reloaded.config.shed_mlp_sizes == [width - 2 * GROUP, width, width - GROUP]


@pytest.mark.parametrize("family", list(CONFIGS))
def test_every_candidate_type_at_once(family, tmp_path):
    """Blocks, mixers, MLPs and channel groups removed together (layer indices shift under block removal)."""
    model, ids = tiny(family), tokens(1)
    names = ["block:0", "mixer:2"] + ([] if family == "mamba2" else ["mlp:1", "mlp-channels:2:0"])
    removed = [Candidate.parse(n) for n in names]
    with masked(model, removed, GROUP):
        want = logits(model, ids)
    remove_structures(model, removed, GROUP)
    torch.testing.assert_close(logits(model, ids), want, atol=ATOL, rtol=0)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64).eval()
    assert torch.equal(logits(reloaded, ids), logits(model, ids))
    assert reloaded.config.num_hidden_layers == 2 and reloaded.config.shed_removed_mixers == [1]


@pytest.mark.parametrize("family", list(CONFIGS))
def test_state_bytes_follow_the_removed_recurrent_mixers(family):
    model = tiny(family)
    adapter = get_adapter(model)
    full = adapter.state_bytes_per_sequence(model.config)
    layout = adapter.structure
    recurrent = [i for i in range(3) if layout.is_recurrent(model.config, i)]
    remove_structures(model, [Candidate("mixer", recurrent[0])])
    assert structure_costs(model)["state_bytes"] == full - full // len(recurrent)


def test_attention_mixer_removal_keeps_the_state():
    model = tiny("qwen3_5")
    full = structure_costs(model)["state_bytes"]
    remove_structures(model, [Candidate("mixer", 1)])  # layer 1 is full attention
    assert structure_costs(model)["state_bytes"] == full


def test_key_channel_pruning_after_shedding(tmp_path):
    """A shed model is a family member for key-channel pruning (the combination in experiments/state_vs_structure)."""
    from state_reduction.pruning.surgery import reduce_model
    from state_reduction.pruning.types import KeyChannelSelection

    model, ids = tiny("gated_deltanet"), tokens()
    remove_structures(model, [Candidate("mixer", 1)])
    adapter = get_adapter(model)
    layers = [r.layer for r in adapter.mixers(model)]
    assert layers == [0, 2]
    before = adapter.state_bytes_per_sequence(model.config)
    keep = torch.arange(8).repeat(4, 1)
    reduce_model(model, {i: KeyChannelSelection(keep=keep) for i in layers})
    assert adapter.state_bytes_per_sequence(model.config) == before // 2
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64).eval()
    assert torch.equal(logits(reloaded, ids), logits(model, ids))


def test_limits_are_one_line_errors():
    mamba = tiny("mamba2")
    mamba.config._name_or_path = "tiny-mamba2"
    with pytest.raises(ValueError, match=r"tiny-mamba2 \(Mamba-2\): target 'mlp' does not exist"):
        candidates(mamba, "mlp")
    with pytest.raises(ValueError, match=r"target 'mixer' has 3 candidates; --steps 3 is outside 1..2 \(at least one "
                                         r"sequence mixer must remain\)"):
        check_steps(mamba, "mixer", 3)
    with pytest.raises(ValueError, match=r"target 'mlp' has 3 candidates; --steps 4 is outside 1..3 \(only 3 exist\)"):
        check_steps(tiny("qwen3_5"), "mlp", 4)
    check_steps(tiny("qwen3_5"), "mlp", 3)
    with pytest.raises(ValueError, match="leaves no sequence mixer"):
        remove_structures(tiny("deltanet"), [Candidate("mixer", i) for i in range(3)])
    with pytest.raises(ValueError, match="--target 'heads'; accepted: block, mixer, mlp, mlp-channels"):
        candidates(mamba, "heads")
    with pytest.raises(ValueError, match="not a multiple of --group-size 48"):
        candidates(tiny("qwen3_5"), "mlp-channels", 48)


def brute_force_ppl(model, removed, windows, group_size=GROUP) -> float:
    """Perplexity of the surgically reduced copy: an independent path from the search's masking."""
    reduced = remove_structures(copy.deepcopy(model), removed, group_size)
    return Scorer(windows, batch_size=4)(reduced)


@pytest.mark.parametrize("family,target,steps", [("deltanet", "block", 2), ("qwen3_5", "mixer", 2),
                                                 ("gated_deltanet", "mlp", 2)])
def test_greedy_equals_brute_force(family, target, steps):
    model = tiny(family, seed=3)
    windows = tokens(seed=5, n=4, length=24)
    found = search(model, target, steps, Scorer(windows, batch_size=4), log=lambda *_: None)
    pool = candidates(model, target, GROUP)
    ppl = {}
    for k in range(1, steps + 1):
        for subset in itertools.combinations(pool, k):
            try:
                ppl[frozenset(subset)] = brute_force_ppl(model, list(subset), windows)
            except ValueError:  # no mixer left
                continue
    prefix = []
    for step, record in enumerate(found["steps"]):
        brute = {c.name: ppl[frozenset(prefix + [c])] for c in pool if c not in prefix
                 and frozenset(prefix + [c]) in ppl}
        assert record["scores"].keys() == brute.keys()
        for name in brute:
            assert record["scores"][name] == pytest.approx(brute[name], rel=1e-9)
        assert record["chosen"] == min(brute, key=lambda n: (brute[n], Candidate.parse(n)))
        prefix.append(Candidate.parse(record["chosen"]))
    assert found["order"] == [c.name for c in prefix]
    best_single = min((s for s in ppl if len(s) == 1), key=lambda s: ppl[s])
    assert found["order"][0] == next(iter(best_single)).name
    assert found["forward_passes"] == sum(len(r["scores"]) for r in found["steps"])  # one batch of 4 windows


def test_one_shot_takes_the_best_dense_scores():
    model = tiny("qwen3_5", seed=1)
    windows = tokens(seed=2, n=4, length=16)
    found = search(model, "mlp-channels", 3, Scorer(windows, batch_size=4), method="one-shot", group_size=GROUP,
                   log=lambda *_: None)
    scores = found["steps"][0]["scores"]
    assert len(found["steps"]) == 1 and len(scores) == 12
    assert found["order"] == sorted(scores, key=lambda n: (scores[n], Candidate.parse(n)))[:3]


CHILD = textwrap.dedent("""
    import os, signal, torch
    torch.set_num_threads(1)
    from state_reduction.backend import install_cpu_backend
    install_cpu_backend()
    from test_shed import tiny, tokens
    from state_reduction.pruning.shed import Scorer, search
    def log(msg):
        if msg.startswith("shed step 2/"):
            os.kill(os.getpid(), signal.SIGKILL)
    search(tiny("deltanet", seed=3), "mlp-channels", 4, Scorer(tokens(seed=5, n=4, length=16), 4), group_size=32,
           state_dir={state!r}, key="k", log=log)
""")


@pytest.mark.slow
def test_resume_after_sigkill_gives_the_same_order(tmp_path):
    state = tmp_path / "search"
    # the child imports test_shed: this folder goes on its PYTHONPATH
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent),
                                                        str(Path(__file__).resolve().parents[2] / "src"),
                                                        os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}
    child = subprocess.run([sys.executable, "-c", CHILD.format(state=str(state))],
                           env=env, capture_output=True, text=True, timeout=300)
    assert child.returncode == -9, child.stderr[-2000:]
    assert sorted(p.name for p in state.iterdir()) == ["step_000.json", "step_001.json"]
    windows = tokens(seed=5, n=4, length=16)
    resumed = search(tiny("deltanet", seed=3), "mlp-channels", 4, Scorer(windows, 4), state_dir=state, key="k",
                     group_size=GROUP, log=lambda *_: None)
    assert resumed["resumed_steps"] == 2
    fresh = search(tiny("deltanet", seed=3), "mlp-channels", 4, Scorer(windows, 4), group_size=GROUP,
                   log=lambda *_: None)
    assert resumed["order"] == fresh["order"]
    assert [r["scores"] for r in resumed["steps"]] == [r["scores"] for r in fresh["steps"]]
    with pytest.raises(ValueError, match="saved by another search"):
        search(tiny("deltanet", seed=3), "mlp-channels", 4, Scorer(windows, 4), state_dir=state, key="other",
               group_size=GROUP)


CHECKPOINTS = Path(__file__).resolve().parents[2] / "experiments" / "tiny_models" / "checkpoints"
COMMITTED = {"deltanet": "delta_net", "gated_deltanet": "gated_deltanet", "mamba2": "mamba2", "qwen3_5": "qwen3_5_text"}


@pytest.mark.parametrize("name", list(COMMITTED))
def test_committed_checkpoint_round_trip(name, tmp_path):
    """A loaded checkpoint (its config carries model_type as an instance field) becomes the _shed variant."""
    model = AutoModelForCausalLM.from_pretrained(CHECKPOINTS / name).eval()
    ids = torch.randint(0, model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    removed = [Candidate("mixer", 0)] + ([] if name == "mamba2" else [Candidate("mlp-channels", 2, 1)])
    before = structure_costs(model)
    with masked(model, removed):
        want = logits(model, ids)
    remove_structures(model, removed)
    torch.testing.assert_close(logits(model, ids), want, atol=1e-5, rtol=0)  # float32
    assert model.config.model_type == COMMITTED[name] + "_shed"
    layers = model.config.num_hidden_layers
    recurrent = sum(get_adapter(model).structure.is_recurrent(model.config, i) for i in range(layers))
    assert structure_costs(model)["state_bytes"] == before["state_bytes"] // recurrent * (recurrent - 1)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert torch.equal(logits(reloaded, ids), logits(model, ids))


def test_cli_prune_method_shed(tmp_path, capsys):
    from state_reduction.cli import main
    from state_reduction.results import read_result

    out = tmp_path / "gdn-shed"
    assert main(["prune", str(CHECKPOINTS / "gated_deltanet"), "--method", "shed", "--target", "mlp", "--steps", "2",
                 "--n-calib", "4", "--seq-len", "32", "--batch-size", "4", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "shed calibration cost: 10 forward passes" in printed  # dense, 4 MLPs, 3 MLPs, masked, reduced
    result = read_result(out / "prune_result.json")
    assert result["kind"] == "prune" and result["config"]["target"] == "mlp"
    assert result["metrics"]["calib_forward_passes"] == 10 and result["metrics"]["n_removed"] == 2
    assert result["metrics"]["parameters_after"] < result["metrics"]["parameters_before"]
    assert result["seeds"] == {"calibration": 0}
    assert sorted(p.name for p in (out / "search").iterdir()) == ["step_000.json", "step_001.json"]
    assert not any(p.name.endswith(".search") for p in tmp_path.iterdir())
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    assert reloaded.config.shed_removed_mlps == [int(n.split(":")[1]) for n in result["extra"]["removed"]]


@pytest.mark.parametrize("model,args,message", [
    ("mamba2", ["--target", "mlp", "--steps", "1"],
     "mamba2 (Mamba-2): target 'mlp' does not exist, Mamba-2 blocks have no MLP; targets of this model: block, mixer"),
    ("deltanet", ["--target", "mixer", "--steps", "4"],
     "deltanet: target 'mixer' has 4 candidates; --steps 4 is outside 1..3 (at least one sequence mixer must remain)"),
    ("qwen3_5", ["--target", "mlp-channels", "--steps", "30", "--group-size", "64"],
     "qwen3_5: target 'mlp-channels' has 24 candidates; --steps 30 is outside 1..24 (only 24 exist)"),
    ("deltanet", ["--target", "heads", "--steps", "1"], "--target 'heads'; accepted: block, mixer, mlp, mlp-channels"),
    ("deltanet", ["--steps", "1"], "needs --target"),
])
def test_cli_bad_input_is_one_line(tmp_path, capsys, model, args, message):
    from state_reduction.cli import main

    assert main(["prune", str(CHECKPOINTS / model), "--method", "shed", "--out", str(tmp_path / "o"), *args]) == 2
    err = [line.rsplit("\r", 1)[-1] for line in capsys.readouterr().err.splitlines()]
    errors = [line for line in err if line.startswith("state-reduction prune: error: ")]  # not transformers' bars
    assert len(errors) == 1 and message in errors[0] and not any("Traceback" in line for line in err)
    assert not (tmp_path / "o").exists()


CACHE_KWARG = {"deltanet": "past_key_values", "gated_deltanet": "past_key_values", "mamba2": "cache", "qwen3_5": "cache"}
DECODE_ATOL = {"deltanet": 1e-10, "gated_deltanet": 1e-10, "mamba2": 1e-5, "qwen3_5": 1e-5}  # as test_adapters


@pytest.mark.parametrize("family", list(CONFIGS))
@pytest.mark.parametrize("names", [["mixer:0"], ["mixer:1"], ["block:0", "mixer:2"]])
def test_cached_decode_of_a_shed_model_equals_the_full_forward(family, names):
    """Removed mixers never touch the cache (mixer:1 of the hybrid is its softmax-attention layer)."""
    model, ids = tiny(family), tokens(length=12)
    remove_structures(model, [Candidate.parse(n) for n in names])

    def cache_of(out):
        return next(getattr(out, k) for k in ("past_key_values", "cache", "cache_params") if getattr(out, k, None))

    with torch.no_grad():
        full = logits(model, ids)
        out = model(ids[:, :8], use_cache=True)
        steps, cache = [out.logits], cache_of(out)
        for t in range(8, 12):
            out = model(ids[:, t:t + 1], use_cache=True, **{CACHE_KWARG[family]: cache})
            steps.append(out.logits)
            cache = cache_of(out)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=DECODE_ATOL[family], rtol=0)


def test_structure_methods_parse():
    from state_reduction.pruning.shed import parse_structure_method

    assert parse_structure_method("drrqr") is None
    assert parse_structure_method("shed-mixer") == ("mixer", None)
    assert parse_structure_method("shed-mlp-channels+grad") == ("mlp-channels", "grad")
    with pytest.raises(ValueError, match="target 'mixers'; accepted: shed-block, shed-mixer"):
        parse_structure_method("shed-mixers")
    with pytest.raises(KeyError, match="did you mean 'drrqr'"):
        parse_structure_method("shed-mixer+drqr")


def test_combined_cell_meets_the_state_budget(tmp_path):
    """shed-mixer+drrqr at 0.5 on the 4-layer DeltaNet: 1 mixer removed (round(0.25 * 4)), then the DRRQR key
    channels that bring the state to at most half the dense model's."""
    from state_reduction.pruning.shed import prune_cell

    out = prune_cell(str(CHECKPOINTS / "deltanet"), "shed-mixer+drrqr", 0.5, tmp_path / "cell", calib="ptb",
                     n_calib=2, seq_len=32, seed=0, batch_size=2)
    dense_state = out["shed"]["costs"]["before"]["state_bytes"]
    assert len(out["shed"]["removed"]) == 1
    final = out["prune"]["state_bytes_per_sequence"]["after"]
    assert final <= dense_state // 2 and final > 0.45 * dense_state  # floor(64 * (1 - 1/3)) = 42 of 64 channels
    assert out["prune"]["key_dim_after"] == 42
    assert {"shed.json", "selection.json"} <= {p.name for p in (tmp_path / "cell").iterdir()}
    assert not (tmp_path / "cell-shed").exists()
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "cell")
    assert reloaded.config.model_type == "delta_net_shed" and reloaded.config.expand_k == 42 * 2 / 128
    assert structure_costs(reloaded)["state_bytes"] == final


def test_paper_plan_of_the_experiment_names_every_method():
    from state_reduction.pipeline import plan_table

    plan = plan_table("state_vs_structure", "state_vs_structure", "paper")
    methods = {config["method"] for _, config in plan["stages"]["prune"]}
    assert methods == {"drrqr", "grad", "shed-mixer", "shed-mixer+drrqr"}
    assert set(plan["models"]) == {"deltanet-1.3b", "gated_deltanet-1.3b", "mamba-codestral-7b", "qwen3_5-9b"}


@pytest.mark.parametrize("family", list(CONFIGS))
def test_decode_timing_runs_on_every_family(family):
    from state_reduction.pruning.shed import decode_timing

    dense = tiny(family)
    reduced = remove_structures(copy.deepcopy(dense), [Candidate("mixer", 0)])
    timing = decode_timing(dense, reduced, prompt_len=8, warmup=1, steps=2, repeats=2)
    assert timing["decode_ms_per_token"] > 0 and timing["decode_ms_per_token_dense"] > 0
    assert timing["decode_speedup"] > 0


@pytest.mark.parametrize("family", list(CONFIGS))
def test_rft_accepts_a_shed_student(family, tmp_path):
    """RFT's teacher/student check and LoRA targets: a _shed student of the teacher's family, LoRA on the mixers
    that remain."""
    from state_reduction.rft.config import RFTError
    from state_reduction.rft.targets import resolve_lora_targets
    from state_reduction.rft.trainer import check_pair

    teacher = tiny(family)
    layout = get_adapter(teacher).structure
    recurrent = [i for i in range(3) if layout.is_recurrent(teacher.config, i)]
    student = remove_structures(copy.deepcopy(teacher), [Candidate("mixer", recurrent[0])])
    check_pair(student, teacher, str(tmp_path), str(tmp_path))  # no tokenizer there: the vocabulary check only
    names = resolve_lora_targets(student, None)
    assert names and not any(n.startswith(f"{layout.layers}.{recurrent[0]}.") for n in names)
    other = tiny("mamba2" if family != "mamba2" else "deltanet")
    with pytest.raises(RFTError, match="the teacher must be the unpruned model"):
        check_pair(student, other, str(tmp_path), str(tmp_path))
