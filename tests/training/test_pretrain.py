"""Tiny-model pretraining: a killed run resumes bit-for-bit; the schedule and batches are deterministic."""

import json

import pytest
import torch

from state_reduction.checkpoints import RunStateError
from state_reduction.errors import InputError
from state_reduction.models import FAMILIES, build_model
from state_reduction.training.pretrain import PretrainConfig, batch_indices, lr_factor, train, unigram_nll, window_nll

MAMBA2 = dict(hidden_size=32, num_hidden_layers=2, state_size=16, n_groups=2, expand=2, head_dim=16, num_heads=4,
              conv_kernel=4, chunk_size=8, vocab_size=64)


def _cfg(**kw):
    base = dict(name="t", family="mamba2", model=MAMBA2, seq_len=16, batch_size=4, steps=6, lr=1e-2,
                warmup_steps=2, checkpoint_every=2, seed=3)
    base.update(kw)
    return PretrainConfig(**base)


def test_lr_schedule_warmup_then_cosine_to_floor():
    cfg = _cfg(steps=100, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_factor(0, cfg) == pytest.approx(0.1)
    assert lr_factor(9, cfg) == pytest.approx(1.0)
    assert lr_factor(100, cfg) == pytest.approx(0.1)
    assert all(lr_factor(s, cfg) >= lr_factor(s + 1, cfg) for s in range(10, 100))


def test_batches_are_a_function_of_the_step_and_cover_each_epoch():
    per_epoch = [batch_indices(s, 20, 4, seed=1) for s in range(5)]
    assert sorted(torch.cat(per_epoch).tolist()) == list(range(20))
    assert torch.equal(batch_indices(3, 20, 4, seed=1), per_epoch[3])
    assert not torch.equal(batch_indices(5, 20, 4, seed=1), per_epoch[0])


def test_killed_run_resumes_bit_for_bit(tmp_path):
    cfg = _cfg()
    windows = torch.randint(0, 64, (24, cfg.seq_len), generator=torch.Generator().manual_seed(0))

    straight = build_model("mamba2", MAMBA2, seed=0)
    train(straight, windows, cfg, tmp_path / "a")

    interrupted = build_model("mamba2", MAMBA2, seed=0)
    train(interrupted, windows, cfg, tmp_path / "b", stop_at=3)  # dies after step 3, last checkpoint at 2
    resumed = build_model("mamba2", MAMBA2, seed=0)
    train(resumed, windows, cfg, tmp_path / "b")

    for (name, p), q in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(p, q), name
    log_a = [json.loads(x) for x in (tmp_path / "a" / "log.jsonl").read_text().splitlines()]
    log_b = [json.loads(x) for x in (tmp_path / "b" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log_b] == list(range(1, 7))
    assert log_a == log_b


def test_resume_refuses_a_state_from_another_config(tmp_path):
    windows = torch.randint(0, 64, (24, 16))
    train(build_model("mamba2", MAMBA2), windows, _cfg(), tmp_path, stop_at=2)
    with pytest.raises(RunStateError, match="another config"):
        train(build_model("mamba2", MAMBA2), windows, _cfg(lr=5e-3), tmp_path)


def test_window_nll_matches_model_loss_and_unigram_is_proper():
    model = build_model("mamba2", MAMBA2, seed=0)
    tokens = torch.randint(0, 64, (3 * 16 + 5,))
    nll = window_nll(model, tokens, seq_len=16, batch_size=2)
    assert nll.shape == (3, 15)
    loss = model(input_ids=tokens[:48].view(3, 16), labels=tokens[:48].view(3, 16)).loss
    assert nll.mean().item() == pytest.approx(loss.item(), rel=1e-5)
    counts = torch.bincount(tokens, minlength=64)
    uni = unigram_nll(counts, tokens, seq_len=16)
    assert uni.shape == (3, 15)
    every_token_once = torch.stack([torch.zeros(64, dtype=torch.long), torch.arange(64)], dim=1).flatten()
    probs = torch.exp(-unigram_nll(counts, every_token_once, seq_len=2)[:, 0])
    assert probs.sum().item() == pytest.approx(1.0, abs=1e-9)


MQAR = {"batch": 3, "min_pairs": 1, "max_pairs": 3, "vocab": {"n_keys": 4, "n_values": 4, "n_noise": 4, "first": 40},
        "eval_pairs": [2]}


def test_text_only_configs_keep_their_identity():
    assert "mqar" not in _cfg().to_dict()
    assert _cfg().hash() != _cfg(mqar=MQAR).hash()


def test_mqar_mixture_resumes_bit_for_bit_and_scores_only_recalled_values(tmp_path):
    from state_reduction.training.pretrain import mixed_mqar_loss, mqar_training_batch

    cfg = _cfg(mqar=MQAR)
    windows = torch.randint(0, 40, (24, cfg.seq_len), generator=torch.Generator().manual_seed(0))
    straight = build_model("mamba2", MAMBA2, seed=0)
    train(straight, windows, cfg, tmp_path / "a")
    interrupted = build_model("mamba2", MAMBA2, seed=0)
    train(interrupted, windows, cfg, tmp_path / "b", stop_at=3)
    resumed = build_model("mamba2", MAMBA2, seed=0)
    train(resumed, windows, cfg, tmp_path / "b")
    for (name, p), q in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(p, q), name

    # the loss equals the full model's: text CE over every next token plus CE over the queried values only
    model = build_model("mamba2", MAMBA2, seed=1)
    text = windows[:2]
    loss, parts = mixed_mqar_loss(model, text, step=5, cfg=cfg)
    ids, labels = mqar_training_batch(5, cfg)
    with torch.no_grad():
        expect_text = model(input_ids=text, labels=text).loss
        expect_mqar = model(input_ids=ids, labels=labels).loss
    assert parts["loss_text"] == pytest.approx(expect_text.item(), rel=1e-5)
    assert parts["loss_mqar"] == pytest.approx(expect_mqar.item(), rel=1e-5)
    assert loss.item() == pytest.approx(expect_text.item() + expect_mqar.item(), rel=1e-5)
    weighted, _ = mixed_mqar_loss(model, text, step=5, cfg=_cfg(mqar={**MQAR, "text_weight": 0.1}))
    assert weighted.item() == pytest.approx(0.1 * expect_text.item() + expect_mqar.item(), rel=1e-5)
    # the curriculum: MQAR alone before `text_from_step`, the weighted mixture from it on
    curriculum = _cfg(mqar={**MQAR, "text_weight": 0.1, "text_from_step": 6})
    before, _ = mixed_mqar_loss(model, text, step=5, cfg=curriculum)
    assert before.item() == pytest.approx(expect_mqar.item(), rel=1e-5)
    ids6, labels6 = mqar_training_batch(6, curriculum)
    with torch.no_grad():
        expect_mqar6 = model(input_ids=ids6, labels=labels6).loss
    from_step, _ = mixed_mqar_loss(model, text, step=6, cfg=curriculum)
    assert from_step.item() == pytest.approx(0.1 * expect_text.item() + expect_mqar6.item(), rel=1e-5)


def test_unknown_mqar_keys_are_named(tmp_path):
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(dict(name="t", family="mamba2", model=MAMBA2, mqar={"batch": 2, "pairs": 3})))
    with pytest.raises(ValueError, match=r"unknown mqar keys \['pairs'\]"):
        PretrainConfig.from_yaml(path)


@pytest.mark.parametrize("family", sorted(f.name for f in FAMILIES.values() if f.decay_init is not None))
def test_decay_half_life_sets_every_head_and_nothing_else(family):
    from state_reduction.models.families.decay_init import decay_modules, initial_half_lives

    stock = build_model(family, FAMILIES[family].test_config, seed=0)
    model = build_model(family, FAMILIES[family].test_config, seed=0)
    n = FAMILIES[family].decay_init(model, 20.0, 80.0, seed=1)
    heads = torch.cat(initial_half_lives(model))
    assert n == heads.numel() > 0 and len(decay_modules(model)) > 0
    assert heads.min() >= 20.0 * (1 - 1e-9) and heads.max() <= 80.0 * (1 + 1e-9)
    # the decay the layer computes at a = 0 keeps half of the state after h tokens
    m = decay_modules(model)[0]
    rate = m.A_log.double().exp().flatten() * torch.nn.functional.softplus(m.dt_bias.double()).flatten()
    assert torch.allclose(torch.exp(-rate * initial_half_lives(model)[0]), torch.full_like(rate, 0.5))
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, stock.state_dict()[k])}
    assert changed and all(k.endswith(("A_log", "dt_bias")) for k in changed), changed


def test_decay_half_life_is_checked_and_keeps_other_identities(tmp_path):
    import yaml

    assert "decay_half_life" not in _cfg().to_dict()
    assert _cfg().hash() != _cfg(decay_half_life=(8.0, 16.0)).hash()
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(dict(name="t", family="mamba2", model=MAMBA2, decay_half_life=[16, 8])))
    with pytest.raises(InputError, match=r"decay_half_life must be \[low, high\].*\[16, 8\]"):
        PretrainConfig.from_yaml(path)
    no_gate = next(f.name for f in FAMILIES.values() if f.decay_init is None)
    path.write_text(yaml.safe_dump(dict(name="t", family=no_gate, model={}, decay_half_life=[8, 16])))
    with pytest.raises(InputError, match=rf"family '{no_gate}' has no decay gate.*gated_deltanet"):
        PretrainConfig.from_yaml(path)


def test_pair_count_curriculum_draws_few_pairs_before_start_steps(tmp_path):
    import yaml

    from state_reduction.data.mqar import IGNORE_INDEX
    from state_reduction.training.pretrain import mqar_training_batch

    cfg = _cfg(seq_len=32, mqar={**MQAR, "batch": 64, "min_pairs": 1, "max_pairs": 4, "start_max_pairs": 2,
                                 "start_steps": 4, "vocab": {**MQAR["vocab"], "n_keys": 8}})
    queried = [(mqar_training_batch(s, cfg)[1] != IGNORE_INDEX).sum(1) for s in range(8)]
    assert all(q.min() >= 1 and q.max() <= 2 for q in queried[:4])
    assert max(q.max() for q in queried[4:]) > 2
    path = tmp_path / "c.yaml"
    for bad, message in [({"start_max_pairs": 3}, "go together"), ({"start_max_pairs": 9, "start_steps": 4},
                                                                   r"must lie in \[min_pairs, max_pairs\]")]:
        path.write_text(yaml.safe_dump(dict(name="t", family="mamba2", model=MAMBA2, mqar={**MQAR, **bad})))
        with pytest.raises(InputError, match=message):
            PretrainConfig.from_yaml(path)
