"""Where each stage computes and in which dtype: the GPU when one is present, fp32 on the CPU.

Every stage (prune calibration, evaluation, RFT, speed benchmarks) asks `resolve_device` for its device, so a
GPU node never calibrates or evaluates on its CPU by omission (issue 22: 38-140 ms per calibration token and
~21 ms per evaluation token on CPU). CPUs without native bf16 run bf16 matmuls ~8x slower than fp32, so a
bf16 checkpoint computes in fp32 there (`compute_dtype`); its saved outputs keep the checkpoint's dtype.
"""

from __future__ import annotations

import torch

from state_reduction.errors import InputError

AUTO = ("auto", None, "")


def resolve_device(requested: str | torch.device | None = None) -> torch.device:
    """`requested`, or for None/"auto" the first GPU when torch sees one, else the CPU."""
    if requested in AUTO:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"--device {requested}: torch.cuda.is_available() is False on this machine; "
                         "accepted: auto, cpu, or cuda where a GPU is present")
    return device


def compute_dtype(device: str | torch.device) -> torch.dtype | str:
    """The dtype to load a checkpoint in for computing on `device`: float32 on the CPU, the checkpoint's own
    ("auto") elsewhere."""
    return torch.float32 if torch.device(device).type == "cpu" else "auto"


def checkpoint_dtype(config) -> torch.dtype:
    """The dtype a checkpoint's config.json declares (float32 when it declares none)."""
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype
