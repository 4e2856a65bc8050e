import torch

from state_reduction.ssm.s5 import S5Classifier, S5Config
from state_reduction.ssm.train import load_s5, save_s5


def _model(seed=0):
    torch.manual_seed(seed)
    return S5Classifier(S5Config(vocab_size=16, n_classes=10, d_model=8, d_state=6, n_layers=2)).double().eval()


def _naive_ssm(layer, u):
    """The recurrence x_t = lambda_bar x_{t-1} + B_bar u_t, y_t = Re(C x_t) + D u_t, one step at a time."""
    lam, b, c = layer.discrete()
    x = torch.zeros(u.shape[0], lam.numel(), dtype=lam.dtype)
    ys = []
    for t in range(u.shape[1]):
        x = lam * x + u[:, t].to(b.dtype) @ b.T
        ys.append((x @ c.T).real + layer.D * u[:, t])
    return torch.stack(ys, 1)


@torch.no_grad()
def test_fft_scan_equals_recurrence_and_modes_are_stable():
    layer = _model().blocks[0].ssm
    u = torch.randn(3, 20, 8, dtype=torch.float64)
    torch.testing.assert_close(layer(u), _naive_ssm(layer, u))
    with torch.no_grad():
        layer.log_neg_real.fill_(5.0)
        layer.log_dt.fill_(3.0)
    assert (layer.discrete()[0].abs() < 1).all()


@torch.no_grad()
def test_masking_a_mode_equals_deleting_it():
    m = _model()
    layer = m.blocks[0].ssm
    keep = torch.tensor([True, False, True, True, False, True])
    u = torch.randn(2, 12, 8, dtype=torch.float64)
    layer.keep.copy_(keep)
    masked = layer(u)
    small = type(layer)(8, int(keep.sum()), 1e-3, 1e-1).double()
    for name in ("log_neg_real", "imag", "log_dt", "B"):
        getattr(small, name).copy_(getattr(layer, name)[keep])
    small.C.copy_(layer.C[:, keep])
    small.D.copy_(layer.D)
    torch.testing.assert_close(masked, small(u))


@torch.no_grad()
def test_padding_does_not_change_logits_and_save_reload_is_exact(tmp_path):
    m = _model()
    tokens = torch.randint(1, 16, (2, 10))
    lengths = torch.tensor([10, 6])
    padded = torch.cat([tokens, torch.zeros(2, 5, dtype=torch.long)], 1)
    short = m(tokens[1:, :6], lengths[1:])
    torch.testing.assert_close(m(padded, lengths)[1:], short)
    m.blocks[1].ssm.keep[2] = False
    save_s5(m.float(), {"name": "x"}, tmp_path / "ck")
    again = load_s5(tmp_path / "ck")
    assert not again.blocks[1].ssm.keep[2]
    torch.testing.assert_close(again(padded, lengths), m(padded, lengths))
