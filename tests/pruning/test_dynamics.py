"""The head dynamics (decay and input gain) collected in calibration equal the families' own formulas, computed
here from each mixer's input hidden states on the committed tiny checkpoints."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

import state_reduction  # noqa: F401
from state_reduction.models.families import get_adapter
from state_reduction.pruning.calibration import calibrate

CHECKPOINTS = Path(__file__).resolve().parents[2] / "experiments" / "tiny_models" / "checkpoints"
pytestmark = pytest.mark.usefixtures("one_thread")


def _reference(family, mixer, x):
    """(a^2, g^2) per value head [B, T, H_v] from the mixer input x [B, T, d], written from each family's forward."""
    if family == "mamba2":
        raw = F.linear(x, mixer.in_proj.weight, mixer.in_proj.bias)[..., -mixer.num_heads:]
        dt = F.softplus(raw.float() + mixer.dt_bias.float()).clamp(*mixer.time_step_limit)
        return torch.exp(dt * -torch.exp(mixer.A_log.float())) ** 2, dt ** 2
    if family == "deltanet":
        beta = mixer.b_proj(x).float().sigmoid()
        return None, beta ** 2
    a_proj, b_proj = (mixer.in_proj_a, mixer.in_proj_b) if family == "qwen3_5" else (mixer.a_proj, mixer.b_proj)
    g = -mixer.A_log.float().exp() * F.softplus(a_proj(x).float() + mixer.dt_bias.float())
    return torch.exp(g) ** 2, b_proj(x).float().sigmoid() ** 2


@pytest.mark.parametrize("family", ["deltanet", "gated_deltanet", "mamba2", "qwen3_5"])
def test_decay_and_gain_statistics_equal_the_families_formulas(family):
    model = AutoModelForCausalLM.from_pretrained(str(CHECKPOINTS / family))
    adapter = get_adapter(model)
    windows = torch.randint(0, model.config.vocab_size, (3, 24), generator=torch.Generator().manual_seed(0))
    inputs = {}
    refs = list(adapter.mixers(model))
    handles = [r.module.register_forward_pre_hook(
        lambda m, args, kwargs, layer=r.layer: inputs.setdefault(layer, []).append(
            kwargs.get("hidden_states", args[0] if args else None).detach()), with_kwargs=True) for r in refs]
    stats = calibrate(model, adapter, windows, batch_size=2)
    for h in handles:
        h.remove()
    for ref in refs:
        s = stats[ref.layer]
        assert s.horizon == 24 and s.qk_l2_normalised == (family != "mamba2")
        hk = adapter.qk_weights(ref.module)[0].shape[0]
        with torch.no_grad():
            parts = [_reference(family, ref.module, x) for x in inputs[ref.layer]]
        for i, name in enumerate(("decay_sq", "gain_sq")):
            if parts[0][i] is None:
                assert getattr(s, name) is None
                continue
            per_v = sum(p[i].double().sum(dim=(0, 1)) for p in parts)
            torch.testing.assert_close(getattr(s, name), per_v.view(hk, -1).mean(1), rtol=1e-6, atol=0)
        if s.decay_sq is not None:
            rho = s.decay_sq / s.n_tokens
            assert ((rho > 0) & (rho < 1)).all()
