import math

import torch
import torch.nn.functional as F

from state_reduction.rft import distillation_loss


def test_loss_is_ce_plus_t_squared_kl_of_teacher_to_student():
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(2, 5, 11, generator=g), torch.randn(2, 5, 11, generator=g)
    ids = torch.randint(0, 11, (2, 5), generator=g)
    loss, ce, kl = distillation_loss(s, t, ids, temperature=2.0, kd_weight=1.0)
    ce_ref = F.cross_entropy(s[:, :-1].reshape(-1, 11), ids[:, 1:].reshape(-1))
    p_t = torch.softmax(t[:, :-1] / 2, -1)
    kl_ref = (p_t * (torch.log(p_t) - torch.log_softmax(s[:, :-1] / 2, -1))).sum(-1).mean()
    assert torch.allclose(ce, ce_ref) and torch.allclose(kl, kl_ref, atol=1e-6)
    assert math.isclose(loss.item(), (ce_ref + 4 * kl_ref).item(), rel_tol=1e-6)


def test_kl_vanishes_for_the_teacher_itself_and_without_teacher():
    s = torch.randn(1, 4, 7)
    ids = torch.randint(0, 7, (1, 4))
    loss, ce, kl = distillation_loss(s, s.clone(), ids, 2.0, 1.0)
    assert abs(kl.item()) < 1e-6 and torch.allclose(loss, ce, atol=1e-5)
    loss, ce, kl = distillation_loss(s, None, ids, 2.0, 1.0)
    assert kl.item() == 0 and loss.item() == ce.item()


def test_ce_weight_scales_the_data_term_and_zero_is_distillation_only():
    g = torch.Generator().manual_seed(1)
    s, t = torch.randn(2, 6, 9, generator=g), torch.randn(2, 6, 9, generator=g)
    ids = torch.randint(0, 9, (2, 6), generator=g)
    full, ce, kl = distillation_loss(s, t, ids, 2.0, 1.0)
    assert torch.equal(distillation_loss(s, t, ids, 2.0, 1.0, ce_weight=1.0)[0], full)  # the earlier loss, bit for bit
    kd_only, ce0, kl0 = distillation_loss(s, t, ids, 2.0, 1.0, ce_weight=0.0)
    assert torch.allclose(kd_only, 4 * kl) and torch.equal(ce0, ce) and torch.equal(kl0, kl)  # CE still reported
    half = distillation_loss(s, t, ids, 2.0, 1.0, ce_weight=0.5)[0]
    assert torch.allclose(half, 0.5 * ce + 4 * kl)
    # distillation only: the teacher itself has (numerically) zero loss
    assert distillation_loss(t, t.clone(), ids, 2.0, 1.0, ce_weight=0.0)[0].abs().item() < 1e-6
