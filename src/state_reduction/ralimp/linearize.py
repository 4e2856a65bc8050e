"""Linearize the MLPs of the last k layers of a checkpoint and measure it beside the dense model.

    python -m state_reduction.ralimp.linearize --model DIR --k K|all --out DIR [--method ralimp|eugen|snnk]
        [--budget 32] [--rank 128] [--tau 1] [--degree 2] [--poly-features 8] [--n-freq 3] [--fit-steps 200]
        [--calib ptb] [--n-calib 16] [--seq-len 128] [--seed 0] [--profile tiny] [--experiment joint_compression]
        [--result PATH]

Writes the linearized checkpoint (registered variant, reloads with AutoModelForCausalLM; trainable, unfolded form)
and a result (kind prune) with: parameters of the dense model and of the deployed (folded) linearized model,
FLOPs per token (matmuls of the whole model, and of the replaced MLPs alone), recurrent-state bytes, the local
distillation's relative errors, and batch-1 cached CPU decode time of both models measured side by side in this
one process (pruning.shed.decode_timing: interleaved repetitions, median). The end-to-end distillation from the
dense model is RFT (`state-reduction rft OUT --teacher MODEL --set 'train_extra=[conv1d,norm,bias,mlp.gated]'`),
which the joint_compression experiment runs through the pipeline. Bad options are one line and exit 2.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer

from state_reduction.backend import install_cpu_backend
from state_reduction.checkpoints import save_model_atomic
from state_reduction.data import sample_sequences
from state_reduction.errors import Error
from state_reduction.models.families import ralimp_classes
from state_reduction.pruning.shed import decode_timing, structure_costs
from state_reduction.ralimp.errors import RalimpError
from state_reduction.ralimp.gated import FoldedGatedMLP, dense_gated_flops_per_token, gated_weights
from state_reduction.ralimp.layers import METHODS
from state_reduction.ralimp.model import LinearizedMLP, decoder_layers, replace_last_mlps
from state_reduction.results import build_result, write_result

# the seed's App. D.6 safeguards for the exponential (rational / SNNK) features: unit-sphere input, exponent clamp
OPTIONS = {"ralimp": {"sphere": True, "clamp": 10.0}, "eugen": {}, "snnk": {"sphere": True, "clamp": 10.0}}
# what --tau / --degree / ... set, per method (a method without the option refuses it in one line)
METHOD_OPTIONS = ("tau", "degree", "poly_features", "n_freq")


class FoldedMLP(nn.Module):
    """A decoder layer's `mlp` in the inference form (accepts and ignores the extra keyword arguments)."""

    def __init__(self, folded: FoldedGatedMLP):
        super().__init__()
        self.folded = folded

    def forward(self, x, **_):
        return self.folded(x)



def deployed(model):
    """A copy of `model` whose linearized MLPs are folded (the inference form)."""
    out = copy.deepcopy(model)
    for layer in decoder_layers(out):
        if isinstance(layer.mlp, LinearizedMLP):
            layer.mlp = FoldedMLP(layer.mlp.gated.fold())
    return out


def linearized_costs(model) -> dict:
    """structure_costs of a model whose linearized MLPs are in the inference form: parameters count each folded
    MLP's deployed parameters (folded matrix, P, Q, input-side projections; the training-time weight side is not
    deployed), FLOPs per token add each folded MLP's (its projections are buffers, not nn.Linear)."""
    folded = [layer.mlp.folded for layer in decoder_layers(model) if isinstance(layer.mlp, FoldedMLP)]
    out = structure_costs(model)
    out["parameters"] += sum(f.deployed_parameters() - sum(p.numel() for p in f.parameters()) for f in folded)
    out["flops_per_token"] += sum(f.flops_per_token() for f in folded)
    return out


def to_variant(model, layers: list[int], spec: dict):
    """The registered variant (models/ralimp_variant.py) holding `model`'s weights, `model` already linearized at
    `layers` with `spec`."""
    config_cls, model_cls = ralimp_classes(model.config.model_type)
    cfg = config_cls(ralimp_layers=layers, ralimp=spec, **{k: v for k, v in model.config.to_dict().items()
                                                          if k not in ("model_type", "architectures")})
    out = model_cls(cfg)
    out.load_state_dict(model.state_dict(), strict=True)
    return out.to(next(model.parameters()).dtype)


def method_spec(method: str, budget: int, rank: int, **options) -> dict:
    """The linearization's construction options as the variant's config records them (None: the default)."""
    return {"method": method, "budget": budget, "rank": rank, **OPTIONS.get(method, {}),
            **{k: v for k, v in options.items() if v is not None}}


def linearize_model(model, ids: torch.Tensor, k, *, spec: dict, seed: int = 0, fit_steps: int = 0,
                    fit_lr: float = 3e-3):
    """(the registered variant of `model` with its last k MLPs linearized, replaced indices, per-layer fit
    errors, init seconds). `ids` [B, T]: the calibration windows."""
    report = {}
    t0 = time.perf_counter()
    idx = replace_last_mlps(model, k, ids, seed=seed, fit_steps=fit_steps, fit_lr=fit_lr, report=report, **spec)
    return to_variant(model, idx, spec).eval(), idx, report, time.perf_counter() - t0


def measure(dense, variant, idx: list[int], decode: dict | None = None) -> dict:
    """Costs of the dense and the deployed linearized model, MLP FLOPs of the replaced layers, and (with `decode`,
    decode_timing's settings) their decode time side by side."""
    inference = deployed(variant).eval()
    layers = decoder_layers(dense)
    before, after = structure_costs(dense), linearized_costs(inference)
    out = {f"{k}_before": float(v) for k, v in before.items()} | {f"{k}_after": float(v) for k, v in after.items()}
    out["mlp_flops_per_token_dense"] = float(sum(
        dense_gated_flops_per_token(gated_weights(layers[i].mlp)[0], gated_weights(layers[i].mlp)[2]) for i in idx))
    out["mlp_flops_per_token_linearized"] = float(sum(decoder_layers(inference)[i].mlp.folded.flops_per_token()
                                                      for i in idx))
    if decode:
        out.update(decode_timing(dense, inference, **decode))
    return out


def fit_metrics(report: dict) -> dict:
    """Mean over the replaced layers of the local fit's relative errors (and the per-layer values in `extra`)."""
    if not report:
        return {}
    n = len(report)
    return {"mlp_rel_error_init": sum(r["rel_error_init"] for r in report.values()) / n,
            "mlp_rel_error_fit": sum(r["rel_error_fit"] for r in report.values()) / n}


def linearize(model_dir: str, k, out: str, *, method: str = "ralimp", budget: int = 32, rank: int = 128,
              calib: str = "ptb", n_calib: int = 16, seq_len: int = 128, seed: int = 0, fit_steps: int = 200,
              fit_lr: float = 3e-3, decode: dict | None = None, data_dir=None, **options) -> dict:
    """Linearize `model_dir`'s last k MLPs, save the variant as `out`; returns replaced layers, metrics, fit report."""
    torch.manual_seed(seed)
    spec = method_spec(method, budget, rank, **options)
    dense = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = sample_sequences(tok, calib, n_calib, seq_len, seed, stream="calibration", data_dir=data_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    variant, idx, report, init_s = linearize_model(model, ids, k, spec=spec, seed=seed, fit_steps=fit_steps,
                                                   fit_lr=fit_lr)
    save_model_atomic(variant, tok, Path(out), overwrite=True)
    metrics = measure(dense, variant, idx, decode if decode is not None else {}) | fit_metrics(report)
    return {"replaced_layers": idx, "metrics": {**metrics, "init_time_s": init_s},
            "fit": {str(i): r for i, r in report.items()}, "spec": spec}


@dataclass(frozen=True)
class LinearizeMethod:
    """A pipeline method `[<selector>+]<method>-k<k>` (e.g. `ralimp-k2`, `drrqr+ralimp-kall`): the MLPs of the
    last k layers linearized by `method` (layers.METHODS), after key-channel pruning by `selector` when named."""

    method: str
    k: object  # an int >= 1 or "all"
    selector: str | None = None


METHOD_PATTERN = re.compile(r"^(?:(?P<selector>[a-z0-9_]+)\+)?(?P<method>[a-z]+)-k(?P<k>[0-9]+|all)$")


def parse_linearize_method(name: str) -> LinearizeMethod | None:
    """The LinearizeMethod a pipeline method name spells, or None when it names no linearization method."""
    m = METHOD_PATTERN.match(str(name))
    if m is None or m["method"] not in METHODS:
        return None
    return LinearizeMethod(m["method"], m["k"] if m["k"] == "all" else int(m["k"]), m["selector"])


def _k(value: str):
    if value == "all":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"an integer >= 1 or 'all', got {value!r}") from None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m state_reduction.ralimp.linearize",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--k", type=_k, required=True, help="layers to replace, counted from the last (or 'all')")
    ap.add_argument("--out", required=True)
    ap.add_argument("--method", default="ralimp")
    ap.add_argument("--budget", type=int, default=32, help="random features of the SiLU linearization")
    ap.add_argument("--rank", type=int, default=128, help="Hadamard rank r of the gated product")
    ap.add_argument("--tau", type=float, default=None)
    ap.add_argument("--degree", type=int, default=None)
    ap.add_argument("--poly-features", type=int, default=None)
    ap.add_argument("--n-freq", type=int, default=None)
    ap.add_argument("--fit-steps", type=int, default=200, help="local distillation steps per replaced layer")
    ap.add_argument("--calib", default="ptb")
    ap.add_argument("--n-calib", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-decode", action="store_true", help="skip the decode timing")
    ap.add_argument("--profile", default="tiny", choices=["tiny", "paper"])
    ap.add_argument("--experiment", default="joint_compression")
    ap.add_argument("--result", default=None, help="result JSON path (default: <out>/linearize_result.json)")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    install_cpu_backend()
    torch.set_num_threads(1)
    config = {k: v for k, v in vars(args).items() if k not in ("result", "profile", "experiment")}
    options = {k: getattr(args, k) for k in METHOD_OPTIONS}
    t0 = time.perf_counter()
    try:
        rec = linearize(args.model, args.k, args.out, method=args.method, budget=args.budget, rank=args.rank,
                        calib=args.calib, n_calib=args.n_calib, seq_len=args.seq_len, seed=args.seed,
                        fit_steps=args.fit_steps, decode=None if args.no_decode else {}, **options)
    except Error as e:
        print(f"ralimp.linearize: error: {e.one_line()}", file=sys.stderr)
        return 2
    result = build_result("prune", profile=args.profile, experiment=args.experiment, config=config,
                          metrics=rec["metrics"], seeds={"seed": args.seed}, wall_time_s=time.perf_counter() - t0,
                          extra={"replaced_layers": rec["replaced_layers"], "fit": rec["fit"],
                                 "ralimp": rec["spec"]})
    path = write_result(args.result or Path(args.out) / "linearize_result.json", result)
    print({k: round(v, 6) for k, v in rec["metrics"].items()})
    print(f"wrote {path}")
    return 0


__all__ = ["LinearizeMethod", "RalimpError", "deployed", "linearize", "linearize_model", "linearized_costs", "measure", "parse_linearize_method",
           "to_variant"]

if __name__ == "__main__":
    sys.exit(main())
