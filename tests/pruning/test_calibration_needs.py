"""Selectors declare what they read; calibration computes exactly the union of it: per selector, the statistics
it needs and no other, the same numbers as a calibration of everything (so the same selection), no gradient pass
unless a selector reads gradients and no calibration at all for the weight-only selectors."""

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import state_reduction  # noqa: F401
from state_reduction.errors import UnknownNameError
from state_reduction.pruning import calibration as calibration_module
from state_reduction.models.families import get_adapter
from state_reduction.pruning.calibration import STATISTICS, calibrate, resolve_needs
from state_reduction.pruning.prune import PruneConfig, prune
from state_reduction.pruning.selectors import MODES, SELECTORS, needs_of, register_selector, select
from state_reduction.pruning.streaming import calibrate_streaming

CHECKPOINTS = Path(__file__).resolve().parents[2] / "experiments" / "tiny_models" / "checkpoints"
# need -> the LayerCalibration fields it fills (what STATISTICS says in words)
FIELDS = {
    "gram": {"gram_q", "gram_k"},
    "normalised_moments": {"sum_q", "sum_k", "sum_qq", "sum_kk"},
    "input_norms": {"input_sq"},
    "dynamics": {"decay_sq", "gain_sq"},
    "window_norms": {"window_norm_qk", "window_norm_q", "window_norm_k"},
    "state_gramians": {"gramian_ctrl", "gramian_obs"},
    "decay_grams": {"decay_score_gram"},
    "gradients": {"saliency_q", "saliency_k"},
    "taylor": {"taylor_q", "taylor_k", "fisher_qq", "fisher_kk", "fisher_qk"},
}
ALL_FIELDS = set().union(*FIELDS.values())

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_vocabulary_is_declared_once():
    assert set(FIELDS) == set(STATISTICS)
    assert all(SELECTORS[n].needs <= set(STATISTICS) for n in SELECTORS)
    assert needs_of(["rand", "l1"]) == frozenset()
    assert needs_of(["wanda", "drrqr"]) == {"input_norms", "gram"}
    assert not hasattr(calibration_module, "NEEDS_GRADIENTS")
    import state_reduction.pruning.prune as prune_module
    assert not hasattr(prune_module, "NEEDS_CALIBRATION") and not hasattr(prune_module, "NEEDS_GRADIENTS")


def test_unknown_need_is_named_with_the_closest():
    with pytest.raises(UnknownNameError, match="selector 'x': unknown need 'gradient'; did you mean 'gradients'"):
        register_selector("x", needs={"gradient"})
    with pytest.raises(UnknownNameError, match="unknown statistic 'grams'; did you mean 'gram'"):
        resolve_needs({"grams"})
    assert "x" not in SELECTORS


def _filled(stats) -> set[str]:
    return {f for s in stats.values() for f in ALL_FIELDS if getattr(s, f) is not None}


class Counter:
    def __init__(self, monkeypatch):
        self.backward = self.forward = 0
        original = torch.Tensor.backward

        def backward(tensor, *args, **kwargs):
            self.backward += 1
            return original(tensor, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "backward", backward)


@pytest.mark.parametrize("family", ["gated_deltanet", "mamba2"])
@pytest.mark.parametrize("streamed", [False, True])
def test_each_selector_gets_exactly_its_statistics_and_the_same_selection(family, streamed, monkeypatch):
    model = AutoModelForCausalLM.from_pretrained(str(CHECKPOINTS / family))
    adapter = get_adapter(model)
    windows = torch.randint(0, model.config.vocab_size, (3, 24), generator=torch.Generator().manual_seed(0))
    run = calibrate_streaming if streamed else calibrate
    everything = run(model, adapter, windows, batch_size=2, needs=set(STATISTICS))
    forward_only = run(model, adapter, windows, batch_size=2, needs=set(STATISTICS) - {"gradients", "taylor"})
    assert _filled(everything) == ALL_FIELDS
    counter = Counter(monkeypatch)
    _, K = adapter.key_heads(model.config)
    for name, selector in SELECTORS.items():
        counter.backward = 0
        stats = run(model, adapter, windows, batch_size=2, needs=selector.needs)
        assert _filled(stats) == set().union(*(FIELDS[n] for n in selector.needs)), name
        assert counter.backward == (2 if selector.gradients else 0), name  # one per batch, or none
        # fla's GatedDeltaNet runs another kernel with autograd on: forward statistics compare like with like
        reference = everything if selector.gradients else forward_only
        for ref in adapter.mixers(model):
            w_q, w_k = (w.detach() for w in adapter.qk_weights(ref.module))
            for mode in MODES:
                a, b = (select(name, s[ref.layer], w_q, w_k, K // 2, mode, torch.Generator().manual_seed(0), ref.layer)
                        for s in (stats, reference))
                assert torch.equal(*(x.keep if x.keep is not None else x.rotation for x in (a, b))), (name, mode)
    counter.backward = 0
    assert _filled(run(model, adapter, windows, batch_size=2, needs=set())) == set() and counter.backward == 0


def test_prune_calibrates_only_for_what_the_selector_reads(tmp_path, monkeypatch):
    """l1 needs nothing: no calibration; wanda needs input norms: a forward pass and no gradient pass; grad: one
    backward per gradient batch."""
    calls = []
    original = calibration_module.calibrate

    def spy(*args, **kwargs):
        calls.append(kwargs.get("needs"))
        return original(*args, **kwargs)

    monkeypatch.setattr("state_reduction.pruning.prune.calibrate", spy)  # prune's own name for it
    counter = Counter(monkeypatch)
    fast = dict(ratio=0.5, n_calib=2, seq_len=32, batch_size=1)
    model = str(CHECKPOINTS / "deltanet")
    for method, n_calls, n_backward in (("l1", 0, 0), ("rand", 0, 0), ("wanda", 1, 0), ("energy", 1, 0),
                                        ("think", 1, 0), ("grad", 1, 2), ("taylor", 1, 2)):
        calls.clear()
        counter.backward = 0
        record = prune(PruneConfig(model=model, method=method, out=str(tmp_path / method), **fast))
        assert len(calls) == n_calls and counter.backward == n_backward, method
        assert calls == ([SELECTORS[method].needs] if n_calls else [])
        assert (record["calibration"] is None) == (n_calls == 0)
