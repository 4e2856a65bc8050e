"""Linearize the MLPs of the last k layers of a checkpoint and measure it beside the dense model.

    python -m state_reduction.ralimp.linearize --model DIR --k K --out DIR [--method ralimp] [--budget 32]
        [--rank 128] [--calib ptb] [--n-calib 8] [--seq-len 256] [--seed 0] [--profile tiny]
        [--experiment joint_compression] [--result PATH]

Writes the linearized checkpoint (registered variant, reloads with AutoModelForCausalLM; trainable, unfolded form)
and a result (kind prune) with: parameters of the dense model and of the deployed (folded) linearized model,
MLP FLOPs per token of the replaced layers (dense SwiGLU vs folded RaLiMP), and CPU decode time per token of both
models measured in this one process (greedy, cache on, one thread, interleaved repetitions, median).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from state_reduction.backend import install_cpu_backend
from state_reduction.checkpoints import save_model_atomic
from state_reduction.data import sample_sequences
from state_reduction.models.families import ralimp_classes
from state_reduction.ralimp.gated import FoldedGatedMLP, dense_gated_flops_per_token, gated_weights
from state_reduction.ralimp.model import LinearizedMLP, decoder_layers, replace_last_mlps
from state_reduction.results import build_result, write_result

OPTIONS = {"ralimp": {"sphere": True, "clamp": 10.0}, "eugen": {}, "snnk": {"sphere": True, "clamp": 10.0}}


class _FoldedMLP(torch.nn.Module):
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
            layer.mlp = _FoldedMLP(layer.mlp.gated.fold())
    return out


@torch.no_grad()
def decode_seconds_per_token(model, prompt: torch.Tensor, new_tokens: int) -> float:
    t0 = time.perf_counter()
    model.generate(input_ids=prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                   use_cache=True, pad_token_id=0)
    return (time.perf_counter() - t0) / new_tokens


def measure_decode(models: dict, prompt: torch.Tensor, new_tokens: int = 64, repeats: int = 3) -> dict:
    times = {k: [] for k in models}
    for k, m in models.items():
        decode_seconds_per_token(m, prompt, 4)          # warm-up
    for _ in range(repeats):
        for k, m in models.items():
            times[k].append(decode_seconds_per_token(m, prompt, new_tokens))
    return {k: statistics.median(v) for k, v in times.items()}


def linearize(model_dir: str, k: int, out: str, *, method: str = "ralimp", budget: int = 32, rank: int = 128,
              calib: str = "ptb", n_calib: int = 8, seq_len: int = 256, seed: int = 0, decode_tokens: int = 64) -> dict:
    torch.manual_seed(seed)
    dense = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = sample_sequences(tok, calib, n_calib, seq_len, seed, stream="calibration")
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    spec = {"method": method, "budget": budget, "rank": rank, **OPTIONS.get(method, {})}
    t0 = time.perf_counter()
    idx = replace_last_mlps(model, k, ids, seed=seed, **spec)
    init_s = time.perf_counter() - t0
    variant = to_variant(model, idx, spec).eval()
    out = Path(out)
    save_model_atomic(variant, tok, out, overwrite=True)
    inference = deployed(variant).eval()
    layers = decoder_layers(dense)
    dense_flops = sum(dense_gated_flops_per_token(gated_weights(layers[i].mlp)[0], gated_weights(layers[i].mlp)[2])
                      for i in idx)
    lin_flops = sum(decoder_layers(inference)[i].mlp.folded.flops_per_token() for i in idx)
    dense_params = sum(p.numel() for p in dense.parameters())
    removed = sum(sum(p.numel() for p in layers[i].mlp.parameters()) for i in idx)
    added = sum(decoder_layers(inference)[i].mlp.folded.deployed_parameters() for i in idx)
    prompt = ids[:1, :32]
    decode = measure_decode({"dense": dense, "linearized": inference}, prompt, decode_tokens)
    return {"replaced_layers": idx, "metrics": {
        "params_dense": float(dense_params), "params_linearized": float(dense_params - removed + added),
        "mlp_flops_per_token_dense": float(dense_flops), "mlp_flops_per_token_linearized": float(lin_flops),
        "decode_s_per_token_dense": decode["dense"], "decode_s_per_token_linearized": decode["linearized"],
        "init_time_s": init_s}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--k", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--method", default="ralimp")
    ap.add_argument("--budget", type=int, default=32)
    ap.add_argument("--rank", type=int, default=128)
    ap.add_argument("--calib", default="ptb")
    ap.add_argument("--n-calib", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", default="tiny", choices=["tiny", "paper"])
    ap.add_argument("--experiment", default="joint_compression")
    ap.add_argument("--result", default=None, help="result JSON path (default: <out>/linearize_result.json)")
    args = ap.parse_args(argv)

    install_cpu_backend()
    torch.set_num_threads(1)

    config = {k: v for k, v in vars(args).items() if k not in ("result", "profile", "experiment")}
    t0 = time.perf_counter()
    rec = linearize(args.model, args.k, args.out, method=args.method, budget=args.budget, rank=args.rank,
                    calib=args.calib, n_calib=args.n_calib, seq_len=args.seq_len, seed=args.seed)
    result = build_result("prune", profile=args.profile, experiment=args.experiment, config=config,
                          metrics=rec["metrics"], seeds={"seed": args.seed}, wall_time_s=time.perf_counter() - t0,
                          extra={"replaced_layers": rec["replaced_layers"]})
    path = write_result(args.result or Path(args.out) / "linearize_result.json", result)
    print({k: round(v, 6) for k, v in rec["metrics"].items()})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()


def to_variant(model, layers: list[int], spec: dict):
    """The registered variant (models/ralimp_variant.py) holding `model`'s weights, `model` already linearized at
    `layers` with `spec`."""
    config_cls, model_cls = ralimp_classes(model.config.model_type)
    cfg = config_cls(ralimp_layers=layers, ralimp=spec, **{k: v for k, v in model.config.to_dict().items()
                                                          if k not in ("model_type", "architectures")})
    out = model_cls(cfg)
    out.load_state_dict(model.state_dict(), strict=True)
    return out.to(next(model.parameters()).dtype)
