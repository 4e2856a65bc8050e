"""rft.trainer after the split of _run into setup / resume / loop / save-merge: its learning-rate schedule is its
own (typed for RFTConfig, over training.schedule, which pretraining shares), and the steps compose as run_rft."""

import dataclasses
import math

import pytest

from state_reduction.rft import RFTConfig
from state_reduction.rft import trainer as rft_trainer
from state_reduction.training.pretrain import PretrainConfig
from state_reduction.training.pretrain import lr_factor as pretrain_lr_factor
from state_reduction.training.schedule import warmup_cosine


def reference(step, steps, warmup, floor):  # the formula both trainers used before the shared schedule
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


@pytest.mark.parametrize("steps, warmup, floor", [(4, 1, 0.1), (2000, 50, 0.1), (10, 0, 0.0), (7, 7, 0.5)])
def test_rft_lr_factor_is_the_warmup_cosine_of_its_own_config(steps, warmup, floor):
    cfg = RFTConfig.from_preset("paper", "s", "t", "o", steps=steps, warmup_steps=warmup, min_lr_ratio=floor)
    pre = PretrainConfig(name="x", family="delta_net", model={}, steps=steps, warmup_steps=warmup, min_lr_ratio=floor)
    for step in range(steps + 2):
        expected = reference(step, steps, warmup, floor)
        assert rft_trainer.lr_factor(step, cfg) == expected == warmup_cosine(step, steps, warmup, floor)
        assert pretrain_lr_factor(step, pre) == expected
    if warmup < steps:  # the last step reaches the floor
        assert rft_trainer.lr_factor(steps, cfg) == pytest.approx(floor)


def test_the_steps_compose_as_run_rft(tmp_path, pruned_deltanet, dense_deltanet, small_config):
    """setup -> resume -> loop -> save-merge, called one by one, give run_rft's record and weights."""
    whole = rft_trainer.run_rft(small_config(pruned_deltanet, dense_deltanet, tmp_path / "whole", steps=2))
    cfg = small_config(pruned_deltanet, dense_deltanet, tmp_path / "steps", steps=2)
    cfg.validate()
    ctx = rft_trainer.DistContext(cfg)
    run = rft_trainer._setup(cfg, ctx)
    rft_trainer._resume(cfg, ctx, run)
    assert run.step == 0 and run.optimizer is not None and run.wrapped is run.model
    logger = rft_trainer._Logger(cfg, run.out, ctx, run.step)
    try:
        assert rft_trainer._loop(cfg, ctx, run, logger, None) is None and run.step == 2
        record = rft_trainer._save_merge(cfg, ctx, run, logger)
    finally:
        logger.close()
        ctx.close()
    assert [r["loss"] for r in run.history] == [whole["metrics"]["first_loss"], whole["metrics"]["last_loss"]]
    assert record["model"]["weights_sha256"] == whole["model"]["weights_sha256"]
    again = dataclasses.replace(cfg, resume=True)
    assert rft_trainer._setup(again, rft_trainer.DistContext(again)) == record  # finished: the record, no training
