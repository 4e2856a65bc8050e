"""Where stages compute: the GPU when present, fp32 on a CPU, and peak memory read from the device that worked."""

import pytest
import torch

from state_reduction import devices, peak_memory


def test_auto_is_the_gpu_when_torch_sees_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert devices.resolve_device(None) == torch.device("cuda")
    assert devices.resolve_device("auto") == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert devices.resolve_device(None) == torch.device("cpu")
    assert devices.resolve_device("cpu") == torch.device("cpu")


def test_cuda_without_a_gpu_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"--device cuda: torch.cuda.is_available\(\) is False.*accepted: auto, cpu"):
        devices.resolve_device("cuda")


def test_a_cpu_computes_in_fp32_a_gpu_in_the_checkpoints_dtype():
    assert devices.compute_dtype("cpu") is torch.float32
    assert devices.compute_dtype(torch.device("cuda")) == "auto"


def test_cpu_work_reads_the_host_peak_even_where_cuda_exists(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: 0)
    rss = peak_memory.host_peak_rss_bytes()
    assert rss > 50 * 2**20  # torch alone is larger
    assert peak_memory.peak_memory_bytes("cpu") >= rss
    assert peak_memory.peak_memory_bytes("cuda") == 0  # a CUDA device reads the allocator
    peaks = peak_memory.process_peaks()  # what a result records
    assert peaks["cuda_bytes"] == 0 and peaks["rss_bytes"] >= rss
    assert peak_memory.host_rss_bytes() > 50 * 2**20  # the current RSS (ru_maxrss may lag it by a page or so)


def test_checkpoint_dtype_reads_the_config():
    from transformers import PretrainedConfig

    assert devices.checkpoint_dtype(PretrainedConfig(dtype="bfloat16")) is torch.bfloat16
    assert devices.checkpoint_dtype(PretrainedConfig()) is torch.float32


@pytest.fixture
def gpu_present(monkeypatch):
    """torch reports a GPU; Module.to records where a model is sent and leaves it on the CPU."""
    sent = []
    real_to = torch.nn.Module.to

    def record(self, *args, **kwargs):
        target = args[0] if args else kwargs.get("device")
        if isinstance(target, (str, torch.device)):
            sent.append(torch.device(target))
            return self
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "stand-in GPU")
    monkeypatch.setattr(torch.nn.Module, "to", record)
    return sent


def test_prune_calibrates_on_the_gpu_by_default(tmp_path, gpu_present):
    from state_reduction.pruning.prune import PruneConfig, prune
    from state_reduction.provenance import TINY_CHECKPOINTS

    torch.set_num_threads(1)
    record = prune(PruneConfig(model=str(TINY_CHECKPOINTS / "deltanet"), method="wanda", ratio=0.5,
                               out=str(tmp_path / "o"), n_calib=2, seq_len=32, batch_size=2))
    assert torch.device("cuda") in gpu_present and record["device"] == "cuda"


def test_run_table_evaluations_and_evaluate_use_the_gpu_by_default(tmp_path, gpu_present, monkeypatch):
    from state_reduction.cli import build_parser
    from state_reduction.pipeline import Cell, _Runner

    assert build_parser().parse_args(["evaluate", "m", "--out", "x"]).device == "auto"
    monkeypatch.setattr("state_reduction.pipeline.stages.evaluate", lambda *a, **k: {
        "metrics": {"wiki_word_perplexity": 1.0}, "data": {}, "suite": "tiny_ppl", "tasks": [], "n_examples": {},
        "lm_eval_version": "stub"})
    spec = {"experiment": "device_test", "methods": ["l1"], "profiles": {"tiny": {
        "models": {"deltanet": {"path": "experiments/tiny_models/checkpoints/deltanet", "stands_for": ["DeltaNet"]}},
        "prune": {"calib": "ptb", "n_calib": 2, "seq_len": 32, "seed": 0}, "rft": {"preset": "tiny"},
        "evaluate": {"suite": "tiny_ppl", "batch_size": 8, "max_length": 128, "limit": 1}}}, "tables": {}}
    runner = _Runner(spec, "tiny", results_root=tmp_path)
    result = runner.run_eval("deltanet-baseline-r0-eval", runner.eval_config(Cell("deltanet", "baseline", 0.0), False))
    assert gpu_present == [torch.device("cuda")] and result["extra"]["device"] == "cuda"
