"""Where stages compute: the GPU when present, fp32 on a CPU, and peak memory read from the device that worked."""

import pytest
import torch

from state_reduction import devices


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
    rss = devices.host_peak_rss_bytes()
    assert rss > 50 * 2**20  # torch alone is larger
    assert devices.peak_memory_bytes("cpu") >= rss
    assert devices.peak_memory_bytes("cuda") == 0  # a CUDA device reads the allocator


def test_checkpoint_dtype_reads_the_config():
    from transformers import PretrainedConfig

    assert devices.checkpoint_dtype(PretrainedConfig(dtype="bfloat16")) is torch.bfloat16
    assert devices.checkpoint_dtype(PretrainedConfig()) is torch.float32
