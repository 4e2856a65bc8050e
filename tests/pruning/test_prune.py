"""`state-reduction prune` end to end on the committed tiny checkpoints: every method on every family,
the coupled modes, reload with stock loaders at the reduced key dimension, and the bad inputs."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import state_reduction  # noqa: F401
from state_reduction.cli import main
from state_reduction.errors import InputError
from state_reduction.models.families import get_adapter
from state_reduction.pruning.prune import PruneConfig, prune
from state_reduction.pruning.selectors import SELECTORS

CHECKPOINTS = Path(__file__).resolve().parents[2] / "experiments" / "tiny_models" / "checkpoints"
FAMILIES = ["deltanet", "gated_deltanet", "mamba2", "qwen3_5"]
FAST = dict(n_calib=2, seq_len=64, batch_size=2)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _check(out: Path, family: str, kept: int):
    model = AutoModelForCausalLM.from_pretrained(str(out))
    adapter = get_adapter(model)
    assert adapter.key_heads(model.config)[1] == kept
    record = json.loads((out / "selection.json").read_text())
    assert record["key_dim_before"] == 64 and record["key_dim_after"] == kept
    sb = record["state_bytes_per_sequence"]
    assert sb["after"] * 64 == sb["before"] * kept
    assert record["provenance"]["git_commit"]
    ids = torch.randint(0, model.config.vocab_size, (1, 40))
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=ids).logits).all()
    return record


@pytest.mark.parametrize("ratio,kept", [(0.5, 32), (0.75, 16)])
@pytest.mark.parametrize("mode", ["kq", "k", "q"])
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("method", sorted(SELECTORS))
def test_every_method_family_mode_and_ratio(tmp_path, family, method, mode, ratio, kept):
    out = tmp_path / "m"
    config = PruneConfig(model=str(CHECKPOINTS / family), method=method, ratio=ratio, select=mode, out=str(out), **FAST)
    missing = SELECTORS[method].missing(get_adapter(AutoConfig.from_pretrained(config.model)))
    if missing is not None:  # ghost needs a decay, which DeltaNet lacks
        with pytest.raises(InputError, match=f"selector '{method}' cannot serve family .*: it needs"):
            prune(config)
        assert not out.exists()
        return
    prune(config)
    record = _check(out, family, kept)
    layers = record["selection"]
    assert layers, "no layer selected"
    for sel in layers.values():
        if method.startswith("pca"):
            assert sel["rotation_shape"][1:] == [kept, 64]
        else:
            assert all(len(head) == kept and head == sorted(set(head)) for head in sel["keep"])
    if SELECTORS[method].needs:
        assert record["calibration"]["tokens"] == 2 * 64 and record["calibration"]["sha256"]


def test_selector_options_reach_the_selector_and_the_record(tmp_path, monkeypatch):
    """--selector-options swaps=3 (issue 19): qkscore gets swaps=3 in every layer, the recorded config names it; a
    run without options records the config as before options existed (its config key unchanged)."""
    seen = []
    real = SELECTORS["qkscore"]

    def spy(x, *, swaps: int = 0):
        seen.append(swaps)
        return real.fn(x, swaps=swaps)

    monkeypatch.setitem(SELECTORS, "qkscore", type(real)(real.name, spy, real.needs, real.serves, real.scores))
    record = prune(PruneConfig(model=str(CHECKPOINTS / "deltanet"), method="qkscore", ratio=0.5, out=str(tmp_path / "a"),
                               selector_options="swaps=3", **FAST))
    assert seen == [3] * 4  # the tiny DeltaNet's four mixers
    assert PruneConfig(model="m", method="qkscore", ratio=0.5, out="o", selector_options="swaps=3").recorded()[
        "selector_options"] == "swaps=3"
    assert "selector_options" not in PruneConfig(model="m", method="qkscore", ratio=0.5, out="o").recorded()
    assert real.options("swaps=2") == {"swaps": 2} and SELECTORS["drrqr"].options("f=1.5, max_swaps=4") == {
        "f": 1.5, "max_swaps": 4}
    assert record["selection"]


def test_ratio_zero_and_seeded_rand_are_reproducible(tmp_path):
    a = prune(PruneConfig(model=str(CHECKPOINTS / "deltanet"), method="rand", ratio=0.5, seed=7, out=str(tmp_path / "a")))
    b = prune(PruneConfig(model=str(CHECKPOINTS / "deltanet"), method="rand", ratio=0.5, seed=7, out=str(tmp_path / "b")))
    c = prune(PruneConfig(model=str(CHECKPOINTS / "deltanet"), method="rand", ratio=0.5, seed=8, out=str(tmp_path / "c")))
    assert a["selection"] == b["selection"] != c["selection"]
    prune(PruneConfig(model=str(CHECKPOINTS / "deltanet"), method="drrqr", ratio=0.0, out=str(tmp_path / "z"), **FAST))
    dense = AutoModelForCausalLM.from_pretrained(str(CHECKPOINTS / "deltanet"))
    same = AutoModelForCausalLM.from_pretrained(str(tmp_path / "z"))
    ids = torch.randint(0, dense.config.vocab_size, (2, 80))
    with torch.no_grad():
        assert torch.equal(dense(input_ids=ids).logits, same(input_ids=ids).logits)


@pytest.mark.parametrize("args,message", [
    (["--method", "drrqr", "--ratio", "1.0"], "compression ratio must be in"),
    (["--method", "drrqr", "--ratio", "-0.1"], "compression ratio must be in"),
    (["--method", "drqr", "--ratio", "0.5"], "did you mean 'drrqr'"),
    (["--method", "l1", "--ratio", "0.5", "--select", "kv"], "--select must be one of"),
    (["--method", "qkscore", "--ratio", "0.5", "--selector-options", "swap=2"],
     "selector 'qkscore': option 'swap=2' is not KEY=VALUE of an option it takes: swaps (default 0)"),
    (["--method", "qkscore", "--ratio", "0.5", "--selector-options", "swaps=two"],
     "selector 'qkscore': option swaps='two' is not an integer"),
    (["--method", "l1", "--ratio", "0.5", "--selector-options", "swaps=2"], "takes: no options"),
    (["--method", "drrqr", "--ratio", "0.5", "--budget", "global-aire", "--selector-options", "f=1.5"],
     "--selector-options with --budget global-aire"),
])
def test_bad_input_is_a_clear_error(tmp_path, capsys, args, message):
    rc = main(["prune", str(CHECKPOINTS / "deltanet"), "--out", str(tmp_path / "o"), *args])
    assert rc == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_existing_output_is_refused_unless_overwrite(tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    assert main(["prune", str(CHECKPOINTS / "deltanet"), "--method", "l1", "--ratio", "0.5", "--out", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(["prune", str(CHECKPOINTS / "deltanet"), "--method", "l1", "--ratio", "0.5", "--out", str(out),
                 "--overwrite"]) == 0
    assert (out / "selection.json").is_file()
    from state_reduction.results import read_result

    result = read_result(out / "prune_result.json")  # the common result schema
    assert result["kind"] == "prune" and result["metrics"]["key_dim_after"] == 32
    assert result["model"]["weights_sha256"] and result["extra"]["dense_model"]["weights_sha256"]


def test_checkpoint_of_another_architecture_is_named(tmp_path, capsys):
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path / "llama"
    LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                 num_key_value_heads=1, vocab_size=50)).save_pretrained(path)
    (tmp_path / "tok").mkdir()
    assert main(["prune", str(path), "--method", "l1", "--ratio", "0.5", "--out", str(tmp_path / "o")]) == 2
    assert "llama" in capsys.readouterr().err


def test_fewer_calibration_tokens_than_channels_warns(tmp_path):
    with pytest.warns(UserWarning, match="(?i)rank|fewer|tokens"):
        prune(PruneConfig(model=str(CHECKPOINTS / "deltanet"), method="drrqr", ratio=0.5, n_calib=1, seq_len=16,
                          out=str(tmp_path / "o")))
    assert (tmp_path / "o" / "selection.json").is_file()


def test_interrupted_save_leaves_nothing(tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("state_reduction.pruning.prune.write_json_atomic", boom)  # dies while writing selection.json
    with pytest.raises(KeyboardInterrupt):
        prune(PruneConfig(model=str(CHECKPOINTS / "deltanet"), method="l1", ratio=0.5, out=str(tmp_path / "o")))
    assert list(tmp_path.iterdir()) == []


def _bf16_copy(tmp_path: Path, family: str) -> Path:
    from transformers import AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(CHECKPOINTS / family)).to(torch.bfloat16)
    out = tmp_path / f"{family}-bf16"
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(str(CHECKPOINTS / family)).save_pretrained(out)
    return out


def test_bf16_checkpoint_calibrates_in_fp32_on_cpu_and_saves_bf16(tmp_path):
    """Issue 22: a CPU without native bf16 runs bf16 ~8x slower; the CPU computes in fp32, the output keeps bf16.
    The selection equals the one computed from an fp32 load of the same bf16 weights."""
    src = _bf16_copy(tmp_path, "gated_deltanet")
    record = prune(PruneConfig(model=str(src), method="wanda", ratio=0.5, out=str(tmp_path / "out"), **FAST))
    assert record["device"] == "cpu" and record["compute_dtype"] == "torch.float32"
    assert record["saved_dtype"] == "torch.bfloat16"
    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"))
    assert next(reloaded.parameters()).dtype == torch.bfloat16
    assert record["peak_memory_bytes"] == record["peak_rss_bytes"] > 0  # CPU work: the host's peak


def test_grad_calibration_micro_batches_equal_one_forward(monkeypatch):
    """Grad's gradient sums are additive over windows: one window per forward (the paper profile's default at
    2048 tokens) gives the scores of four windows per forward."""
    from state_reduction.pruning.calibration import calibrate
    from state_reduction.pruning.prune import grad_batch_size

    assert grad_batch_size(PruneConfig(model="m", method="grad", ratio=0.5, out="o", seq_len=2048, batch_size=4)) == 1
    assert grad_batch_size(PruneConfig(model="m", method="grad", ratio=0.5, out="o", seq_len=256, batch_size=8)) == 8
    model = AutoModelForCausalLM.from_pretrained(str(CHECKPOINTS / "deltanet"))
    adapter = get_adapter(model)
    windows = torch.randint(0, model.config.vocab_size, (4, 48), generator=torch.Generator().manual_seed(0))
    one = calibrate(model, adapter, windows, batch_size=4, gradients=True)
    micro = calibrate(model, adapter, windows, batch_size=1, gradients=True)
    for layer in one:
        torch.testing.assert_close(micro[layer].saliency_q, one[layer].saliency_q, rtol=1e-4, atol=1e-8)
        torch.testing.assert_close(micro[layer].saliency_k, one[layer].saliency_k, rtol=1e-4, atol=1e-8)


def test_mqar_calibration_is_recorded_and_seeded(tmp_path):
    """Issue 15 item 6: `--calib mqar` calibrates a recall model on MQAR sequences of its training settings; the
    record names the generator and hashes the sequences (no corpus file exists); the draw follows --seed."""
    model = CHECKPOINTS / "deltanet_mqar"
    runs = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        assert main(["prune", str(model), "--method", "grad", "--ratio", "0.5", "--calib", "mqar", "--n-calib", "8",
                     "--seq-len", "32", "--seed", str(seed), "--out", str(tmp_path / name)]) == 0
        runs[name] = json.loads((tmp_path / name / "selection.json").read_text())
    cal = runs["a"]["calibration"]
    assert cal["corpus"] == "mqar" and cal["sha256"] is None and cal["tokens"] == 8 * 32
    assert cal["generator"]["max_pairs"] == 8 and cal["generator"]["vocab"]["first"] == 1024
    assert cal == runs["b"]["calibration"] and runs["a"]["selection"] == runs["b"]["selection"]
    assert cal["sequences_sha256"] != runs["c"]["calibration"]["sequences_sha256"]
    from state_reduction.results import read_result

    assert read_result(tmp_path / "a" / "prune_result.json")["data"] == {"mqar": cal["sequences_sha256"]}


def test_mqar_calibration_of_a_text_model_is_one_line(tmp_path, capsys):
    rc = main(["prune", str(CHECKPOINTS / "deltanet"), "--method", "drrqr", "--ratio", "0.5", "--calib", "mqar",
               "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert str(CHECKPOINTS / "deltanet") in err and "`mqar:` section" in err
    assert not (tmp_path / "o").exists()
