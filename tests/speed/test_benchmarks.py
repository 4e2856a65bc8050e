"""Benchmarks end to end on tiny sizes: they run, write valid result files, and refuse bad input. No timed
assertions: speed is reported, never tested."""


import pytest
import torch

from state_reduction.cli import main
from state_reduction.provenance import REPO_ROOT
from state_reduction.results import read_result, validate
from state_reduction.speed.benchmarks import (
    BenchError,
    amdahl,
    bench_decode,
    bench_mixer,
    bench_prefill,
    bench_recurrence,
    resolve_cuda_graphs,
)
from state_reduction.peak_memory import TensorPeak
from state_reduction.speed.models import load_bench_model, reduced_copy
from state_reduction.speed.timing import TimingProtocol

TINY_GDN = str(REPO_ROOT / "experiments" / "tiny_models" / "checkpoints" / "gated_deltanet")
TINY_DN = str(REPO_ROOT / "experiments" / "tiny_models" / "checkpoints" / "deltanet")
ONCE = TimingProtocol(0, 1, 1)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def labels(record):
    return [r["label"] for r in record["extra"]["rows"]]


def test_mixer_rows_and_peak_memory_ratio():
    r = validate(bench_mixer(batches=(1,), seq_len=64, hidden_size=128, num_heads=2, d_v=32, d_k=32, keeps=(24,),
                             protocol=ONCE))
    assert r["kind"] == "bench" and r["config"]["backend"] == "torch-reference-cpu"
    assert r["extra"]["hardware"].startswith("CPU")
    assert labels(r) == ["base", "r50", "r75", "k24"]
    rows = {x["label"]: x for x in r["extra"]["rows"]}
    assert [rows[k]["d_k"] for k in ("base", "r50", "r75", "k24")] == [32, 16, 8, 24]
    assert rows["k24"]["d_k_padded"] == 32
    assert rows["base"]["peak_ratio"] == 1.0 and rows["base"]["speedup"] == 1.0
    assert rows["r75"]["peak_bytes"] < rows["base"]["peak_bytes"]  # fewer key channels, smaller q/k activations


def test_decode_tiny_checkpoint_side_by_side():
    r = validate(bench_decode(TINY_GDN, batches=(1, 2), prompt_len=8, protocol=ONCE))
    assert r["config"]["cuda_graphs"] is False
    assert [(x["batch"], x["label"]) for x in r["extra"]["rows"]] == [
        (1, "base"), (1, "r50"), (1, "r75"), (2, "base"), (2, "r50"), (2, "r75")]
    assert r["model"]["weights_sha256"]
    assert {"ms_per_token_b2_base", "speedup_b2_r75"} <= set(r["metrics"])


def test_prefill_skips_cells_over_the_budget_with_the_reason():
    r = validate(bench_prefill(TINY_DN, grid=((1, 16), (2, 16)), protocol=ONCE, memory_budget=1024))
    assert r["extra"]["rows"] == []
    assert [(s["batch"], s["seq_len"]) for s in r["extra"]["skipped"]] == [(1, 16), (2, 16)]
    assert all("exceeds the memory budget" in s["reason"] for s in r["extra"]["skipped"])


def test_prefill_out_of_memory_cell_is_skipped_and_the_grid_continues(monkeypatch):
    models = {"base": load_bench_model(TINY_DN)[0]}
    models["r50"] = reduced_copy(models["base"], 16)
    real = type(models["base"]).forward

    def forward(self, input_ids=None, **kw):
        if input_ids.shape[1] == 32:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB (simulated)")
        return real(self, input_ids=input_ids, **kw)

    monkeypatch.setattr(type(models["base"]), "forward", forward)
    r = bench_prefill("tiny-deltanet", grid=((1, 16), (1, 32), (2, 16)), protocol=ONCE, models=models)
    assert [(x["batch"], x["seq_len"]) for x in r["extra"]["rows"] if x["label"] == "base"] == [(1, 16), (2, 16)]
    (skip,) = r["extra"]["skipped"]
    assert (skip["batch"], skip["seq_len"]) == (1, 32) and skip["reason"].startswith("out of memory")


def test_recurrence_levels_and_amdahl():
    r = validate(bench_recurrence(batch=2, num_heads=2, d_v=16, d_k=16, levels=("recurrence",), protocol=ONCE))
    assert [(x["level"], x["d_k"], x["state_bound"]) for x in r["extra"]["rows"]] == [
        ("recurrence", 16, 1.0), ("recurrence", 8, 2.0), ("recurrence", 4, 4.0)]
    assert amdahl(1.0, 4.0) == 4.0 and amdahl(0.0, 4.0) == 1.0
    assert amdahl(0.5, 2.0) == pytest.approx(4 / 3)


def test_model_on_another_device_is_an_error():
    base = load_bench_model(TINY_GDN, device="meta")[0]
    with pytest.raises(ValueError, match="model is on meta but the benchmark was asked to run on cpu"):
        bench_decode("x", models={"base": base}, batches=(1,), prompt_len=4, protocol=ONCE)


def test_cuda_graphs_on_cpu_is_an_error_that_says_why():
    with pytest.raises(BenchError, match="records CUDA kernel launches"):
        resolve_cuda_graphs("on", torch.device("cpu"))
    assert resolve_cuda_graphs("auto", torch.device("cpu")) is False


def test_bad_timing_protocol():
    with pytest.raises(ValueError, match="steps >= 1"):
        TimingProtocol(1, 0, 1)


def test_peak_memory_counts_live_tensors():
    with TensorPeak() as m:
        a = torch.empty(1024, dtype=torch.float32)  # 4 KiB
        b = torch.empty(2048, dtype=torch.float32)  # 8 KiB
        del a
        c = torch.empty(256, dtype=torch.float32)  # 1 KiB, after a was freed
        del b, c
    assert m.peak == 12 * 1024


def test_cli_writes_valid_results(tmp_path, capsys):
    out = tmp_path / "mixer.json"
    assert main(["bench", "mixer", "--batch-sizes", "1", "--seq-len", "32", "--keep", "--warmup", "0", "--steps", "1",
                 "--repeats", "1", "--ratios", "0.75", "--out", str(out)]) == 0
    r = read_result(out)
    assert r["extra"]["mode"] == "mixer" and labels(r) == ["base", "r75"]
    assert "torch-reference-cpu" in capsys.readouterr().out

    sm = tmp_path / "sm.json"
    assert main(["bench", "state-memory", "--models", "gdn-1.3b", TINY_GDN, "--budget", "80GiB", "--keep", "77",
                 "--out", str(sm)]) == 0
    rows = read_result(sm)["extra"]["rows"]
    assert [(x["model"], x["kept"]) for x in rows] == [("gdn-1.3b", 128), ("gdn-1.3b", 64), ("gdn-1.3b", 32),
                                                       ("gdn-1.3b", 77), ("gated_deltanet", 64), ("gated_deltanet", 32),
                                                       ("gated_deltanet", 16)]
    assert rows[0]["largest_batch"] == 6826


def test_cli_errors(tmp_path, capsys):
    assert main(["bench", "decode", "--cuda-graphs", "on", "--out", str(tmp_path / "x.json")]) == 2
    assert "CUDA graphs requested on cpu" in capsys.readouterr().err
    assert main(["bench", "state-memory", "--models", "no-such-model"]) == 2
    assert "neither a preset" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_recurrence_levels_are_checked():
    with pytest.raises(BenchError, match="levels must be"):
        bench_recurrence(levels=("kernel",), protocol=ONCE)


def test_recurrence_times_the_kernel_it_is_given():
    """--kernel fused times backend/fused_cpu's step (recorded in config and backend); an unknown one is one line."""
    r = validate(bench_recurrence(batch=2, num_heads=2, d_v=16, d_k=16, levels=("recurrence",), protocol=ONCE,
                                  kernel="fused"))
    assert r["config"]["kernel"] == "fused" and r["config"]["backend"] == "torch-reference-cpu+fused-c-decode"
    assert all(x["traffic_bound_multiple"] > 0 for x in r["extra"]["rows"])
    base = validate(bench_recurrence(batch=2, num_heads=2, d_v=16, d_k=16, levels=("recurrence",), protocol=ONCE))
    assert base["config"]["kernel"] == "torch" and base["config"]["backend"] == "torch-reference-cpu"
    with pytest.raises(BenchError, match="--kernel must be one of torch, fused .* got 'cuda-fused' on cpu"):
        bench_recurrence(levels=("recurrence",), protocol=ONCE, kernel="cuda-fused")
