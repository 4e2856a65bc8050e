"""CLI options generated from the config dataclasses: every field has its option, the parsed options give the
same config as the dataclass, and the command lines of the README and Makefile still parse."""

import argparse
import dataclasses
import shlex

import pytest

from state_reduction.cli import build_parser
from state_reduction.evaluation.run import EvaluateConfig
from state_reduction.options import add_config_options, config_from_args
from state_reduction.pruning.prune import PruneConfig
from state_reduction.pruning.shed import ShedConfig
from state_reduction.rft.cli import FLAGS


def _parse(line: str) -> argparse.Namespace:
    return build_parser().parse_args(shlex.split(line))


@pytest.mark.parametrize("cls", [PruneConfig, ShedConfig])
def test_every_prune_and_shed_field_is_an_option_with_help(cls):
    actions = {a.dest: a for a in build_parser()._subparsers._group_actions[0].choices["prune"]._actions}
    for f in dataclasses.fields(cls):
        assert f.name in actions, f.name
        assert actions[f.name].help, f"{cls.__name__}.{f.name} has no help"


def test_parsed_prune_options_are_the_dataclass_defaults():
    args = _parse("prune ckpt --method drrqr --ratio 0.5 --out o")
    assert config_from_args(PruneConfig, args) == PruneConfig(model="ckpt", method="drrqr", ratio=0.5, out="o")
    args = _parse("prune ckpt --method l1 --ratio 0.25 --out o --n-calib 4 --seq-len 64 --select k --power-of-two "
                  "--multiple 16 --stream-layers --device cpu --data-dir d --overwrite --grad-tokens 512 --seed 3")
    assert config_from_args(PruneConfig, args) == PruneConfig(
        model="ckpt", method="l1", ratio=0.25, out="o", n_calib=4, seq_len=64, select="k", power_of_two=True,
        multiple=16, stream_layers=True, device="cpu", data_dir="d", overwrite=True, grad_tokens=512, seed=3)
    shed = _parse("prune ckpt --method shed --target mixer --steps 2 --out o --search one-shot")
    assert config_from_args(ShedConfig, shed) == ShedConfig(model="ckpt", target="mixer", steps=2, out="o",
                                                            search="one-shot")


def test_evaluate_options_give_the_same_result_config():
    args = _parse("evaluate ckpt --out r.json --limit 0.5 --max-length 64 --suite tiny_mqar")
    cfg = config_from_args(EvaluateConfig, args)
    assert cfg == EvaluateConfig(model="ckpt", suite="tiny_mqar", max_length=64, limit=0.5)
    assert cfg.result_config("cpu") == {"model": "ckpt", "suite": "tiny_mqar", "batch_size": 16, "max_length": 64,
                                        "limit": 0.5, "device": "cpu"}
    assert _parse("evaluate ckpt --out r.json --limit 20").limit == 20


def test_rft_options_are_layered_over_the_preset():
    args = _parse("rft s --teacher t --out o --preset tiny --corpus ptb,wiki --steps 3 --resume")
    given = {name: getattr(args, name) for name in FLAGS if getattr(args, name) is not None}
    assert given == {"corpora": ["ptb", "wiki"], "steps": 3, "resume": True}


def test_bad_values_and_missing_options_are_usage_errors(capsys):
    for line in ("prune ckpt --method l1 --ratio 0.5", "prune ckpt --method l1 --out o --n-calib 0",
                 "evaluate ckpt --out r.json --limit -1", "rft s --out o --steps 0"):
        with pytest.raises(SystemExit) as e:
            _parse(line)
        assert e.value.code == 2, line
    assert "--n-calib" in capsys.readouterr().err


@pytest.mark.parametrize("line", [
    "prune experiments/tiny_models/checkpoints/deltanet --method l1 --ratio 0.5 --out pruned/dn-l1-50",
    "prune experiments/tiny_models/checkpoints/qwen3_5 --method shed --target mixer --steps 2 --out pruned/q",
    "evaluate pruned/gdn-drrqr-50 --suite tiny --out results/tiny/eval/gdn-drrqr-50.json",
    "rft pruned/dn-l1-50 --no-teacher --out unused --export-flame runs/flame/dn-l1-50",
    "rft pruned/dn-l1-50 --teacher experiments/tiny_models/checkpoints/deltanet --out runs/rft/dn-l1-50 "
    "--preset tiny --steps 20",
])
def test_readme_command_lines_parse(line):
    _parse(line)


def test_a_field_name_that_does_not_exist_is_refused():
    with pytest.raises(ValueError, match="PruneConfig has no field 'ratoi'"):
        add_config_options(argparse.ArgumentParser(), PruneConfig, optional=["ratoi"])
