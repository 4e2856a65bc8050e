"""Loading checks of state_reduction.checkpoints that the fault tests do not reach: the finite-weights check finds a
bad value anywhere in a large tensor and its temporaries stay bounded (issue 22)."""

import pytest
import torch
from torch import nn

from state_reduction.checkpoints import check_finite
from state_reduction.errors import InputError
from state_reduction.peak_memory import HeapPeak


def test_check_finite_is_chunked_and_finds_the_last_element():
    model = nn.Module()
    model.embed = nn.Parameter(torch.zeros(4096, 4096))  # 64 MiB fp32: isfinite on all of it takes 112 MiB more
    with HeapPeak() as peak:
        check_finite(model, "m")
    assert peak.peak < model.embed.numel() * 4 / 2
    with torch.no_grad():
        model.embed[-1, -1] = float("nan")  # the sum is NaN: the chunked element-wise check runs
    with HeapPeak() as peak, pytest.raises(InputError, match=r"tensor embed \(4096, 4096\) has 1 non-finite values"):
        check_finite(model, "m")
    assert peak.peak < model.embed.numel() * 4 / 2


def test_check_finite_accepts_finite_weights_whose_sum_overflows():
    model = nn.Module()
    model.w = nn.Parameter(torch.full((8,), 3e38))  # sum inf: the element-wise check decides
    check_finite(model, "m")
    with torch.no_grad():
        model.w[3] = float("-inf")
    with pytest.raises(InputError, match=r"tensor w \(8,\) has 1 non-finite values"):
        check_finite(model, "m")
