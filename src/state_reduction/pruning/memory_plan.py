"""Memory plan of calibration for the paper's large models (issue 8): what sits on the compute device and on the
host, all at once (`calibrate`) and layer-streamed (`calibrate_streaming`), and a heap-peak measurement for the
tiny models on CPU.

Weights, block sizes, embeddings and head are counted exactly from the model built on the meta device from its
configuration. Activations are estimates with named terms (see `plan`), checked against the heap peaks measured
on the tiny models (`measure`, `state-reduction memory-plan CHECKPOINT --measure`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

from state_reduction.atomic import write_json_atomic
from state_reduction.backend import install_cpu_backend
from state_reduction.backend.vocabulary import vocabulary_modules
from state_reduction.checkpoints import load_model
from state_reduction.errors import MissingInputError
from state_reduction.models.families import architectures, get_adapter, speed_presets
from state_reduction.models.families import build_config as family_config
from state_reduction.peak_memory import HeapPeak
from state_reduction.pruning.calibration import calibrate
from state_reduction.pruning.streaming import calibrate_streaming, decoder_blocks

GIB = 1024**3
# Grad: autograd keeps per block more than the block's Linear outputs where the q/k gradient flows (the chunked
# delta-rule intermediates, the norms' and activations' inputs, q/k after conv). Measured with HeapPeak (Grad
# calibration, CPU references, fp32, vocab 32000) on 1.3B-width DeltaNet and Gated DeltaNet, two blocks minus
# one, 128 and 256 tokens: after the q/k gradient sums, 1.5x (DeltaNet) and 1.9x (GDN) B T sum(out_features) x
# 4 bytes (issue 22: the plan without it predicted 9.16 GiB where 14.66 GiB were measured). fla's Triton
# kernels on a GPU save other tensors: measure there (experiments/rehearsal/README.md).
AUTOGRAD_SAVED_PER_OUTPUT = 1.7


# The paper gives no architecture numbers for its two large models; their public configurations are facts of their
# families (state_reduction.models.families: codestral-7b in mamba2, qwen3_5-9b in qwen3_5).
ARCHITECTURES = architectures()
PRESETS = speed_presets()


def build_config(name_or_path: str):
    """The config of a named architecture (ARCHITECTURES), a speed preset (`dn-1.3b`, `gdn-1.3b`), a checkpoint
    folder or config.json, or a hub id (read from the hub, or from the local cache when HF_HUB_OFFLINE=1)."""
    if name_or_path in ARCHITECTURES:
        arch = ARCHITECTURES[name_or_path]
        return family_config(arch.family, **arch.config)
    if name_or_path in PRESETS:
        family, kwargs = PRESETS[name_or_path]
        return family_config(family, **kwargs)
    path = Path(name_or_path)
    if path.is_file():
        return AutoConfig.for_model(**json.loads(path.read_text()))
    if path.is_dir():
        return AutoConfig.from_pretrained(str(path))
    known = ", ".join([*ARCHITECTURES, *PRESETS])
    if name_or_path.count("/") != 1 or name_or_path.startswith((".", "/", "~")):
        raise MissingInputError(f"memory-plan: {name_or_path!r} is neither a known architecture ({known}) nor a "
                                "checkpoint folder, config.json or hub id (owner/name)")
    try:
        return AutoConfig.from_pretrained(name_or_path)
    except (OSError, ValueError) as e:
        raise MissingInputError(f"memory-plan: hub id {name_or_path!r}: its config.json cannot be read ({e}); "
                                f"known architectures: {known}") from None


def _meta_model(config):
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def _numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def plan(config, n_calib: int = 128, seq_len: int = 2048, batch_size: int = 1, weight_bytes: int = 2,
         grad_tokens: int = 2048, vocab_bytes: int | None = None) -> dict:
    """Bytes per term of calibration for `config` at `n_calib` windows of `seq_len` tokens, `batch_size` per forward
    (never more than `n_calib`; Grad: at most `grad_tokens` tokens per forward, as `prune` runs it), weights of
    `weight_bytes` (bf16: 2), the embedding and head of `vocab_bytes` (default `weight_bytes`; a bf16 checkpoint
    computing in fp32 on a CPU keeps them in bf16: 4 and 2, backend.vocabulary).

    Exact (meta model): weights, the largest block, everything outside the blocks, q/k rows, statistics.
    Estimates: `block_activations` = every Linear output and conv channel of one block alive at once for one
    batch (B T sum(out_features) bytes) plus the family's scan intermediates (`scan_bytes_per_token`: Mamba-2's
    torch chunk scan), the calibration hooks' float64 copies of q, k and the projection input, and Grad's logits
    (bf16 logits, their float32 copy and gradient: 10 bytes per entry) and autograd-saved tensors (one block's
    activations again, plus the input gradient)."""
    adapter = get_adapter(config)
    model = _meta_model(config)
    blocks = decoder_blocks(model)
    mixers = list(adapter.mixers(model))
    in_blocks = {id(p) for p in blocks.parameters()}
    vocab = {id(p) for m in vocabulary_modules(model) for p in m.parameters()}
    vocab_bytes = weight_bytes if vocab_bytes is None else vocab_bytes

    def nbytes(params) -> int:
        return sum(p.numel() * (vocab_bytes if id(p) in vocab else weight_bytes) for p in params)
    H, K = adapter.key_heads(config)
    d = config.hidden_size
    batch_size = min(batch_size, n_calib)
    grad_batch = max(1, min(batch_size, grad_tokens // seq_len))
    tokens, grad_tok = batch_size * seq_len, grad_batch * seq_len
    resid = 4 if getattr(config, "residual_in_fp32", False) else weight_bytes

    scan_forward, scan_saved = adapter.scan_bytes_per_token(config, seq_len)
    saved_per_output = adapter.autograd_saved_per_output or AUTOGRAD_SAVED_PER_OUTPUT

    def widths(block):
        return sum(m.out_features for m in block.modules() if isinstance(m, nn.Linear)) + \
            sum(m.out_channels for m in block.modules() if isinstance(m, nn.Conv1d))

    qk_in = {}
    for ref in mixers:
        w_q, _ = adapter.qk_weights(ref.module)
        qk_in[ref.layer] = w_q.shape[2]
    # the largest projection of a mixer bounds the full gradient of the one holding q/k
    proj = max(m.weight.numel() for ref in mixers for m in ref.module.modules() if isinstance(m, nn.Linear))
    n_mixers = len(mixers)
    t = {
        "weights": nbytes(model.parameters()),
        "largest_block": max(_numel(b) for b in blocks) * weight_bytes,
        "outside_blocks": nbytes(p for p in model.parameters() if id(p) not in in_blocks),  # embeddings, norm, head
        "block_activations": tokens * (max(widths(b) for b in blocks) * weight_bytes + scan_forward),
        # Grad: one forward of grad_tok tokens, every block's autograd-saved tensors alive at the backward
        "grad_block_saved": round(grad_tok * (max(widths(b) for b in blocks) * weight_bytes * saved_per_output
                                              + scan_saved)),
        "grad_batch_hidden": grad_tok * d * resid,
        "hook_copies": tokens * (4 * H * K + 2 * max(qk_in.values())) * 8,
        "grad_hook_copies": grad_tok * (4 * H * K + 2 * max(qk_in.values())) * 8,
        "statistics": n_mixers * ((4 * H * K * K + 2 * H * K) * 8 + max(qk_in.values()) * 8),
        "hidden_store": n_calib * seq_len * d * resid,  # host: every window's hidden states
        "batch_hidden": tokens * d * resid,
        "logits": grad_tok * config.vocab_size * 10,
        "qk_gradient_sums": sum(2 * H * K * qk_in[r.layer] for r in mixers) * weight_bytes,
        "projection_gradient": proj * weight_bytes,  # one q/k projection's gradient before QKGradients slices it
        "boundaries": (len(blocks) + 1) * grad_tok * d * resid,  # host, Grad: one batch's block inputs
    }
    L = len(blocks)
    device = {
        "all_at_once_forward": t["weights"] + t["block_activations"] + t["hook_copies"] + t["statistics"]
        + 2 * t["batch_hidden"],
        "all_at_once_grad": t["weights"] + L * (t["grad_block_saved"] + t["grad_batch_hidden"]) + t["grad_hook_copies"]
        + t["statistics"] + t["logits"] + t["qk_gradient_sums"] + t["projection_gradient"],
        "streamed_forward": t["largest_block"] + t["outside_blocks"] + t["block_activations"] + t["hook_copies"]
        + t["statistics"] + 2 * t["batch_hidden"],
        "streamed_grad": t["largest_block"] + t["outside_blocks"] + t["grad_block_saved"] + t["grad_hook_copies"]
        + t["statistics"] + max(t["logits"], 3 * t["grad_batch_hidden"]) + t["projection_gradient"],
    }
    host = {
        "streamed_forward": t["weights"] + t["hidden_store"] + t["batch_hidden"],
        "streamed_grad": t["weights"] + t["boundaries"] + t["qk_gradient_sums"],
    }
    return {"model_type": config.model_type, "n_calib": n_calib, "seq_len": seq_len, "batch_size": batch_size,
            "grad_batch_size": grad_batch,
            "weight_bytes": weight_bytes, "vocab_bytes": vocab_bytes, "parameters": _numel(model), "blocks": L,
            "reducible_layers": n_mixers,
            "key_heads": H, "key_dim": K, "hidden_size": d, "vocab_size": config.vocab_size,
            "terms": t, "device": device, "host": host}


def format_plan(p: dict, title: str = "") -> str:
    def g(b: int) -> str:
        return f"{b / GIB:8.2f} GiB" if b >= GIB else f"{b / 2**20:8.1f} MiB"

    n = p["parameters"]
    count = f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"
    lines = [f"{title or p['model_type']}: {count} parameters, {p['blocks']} blocks "
             f"({p['reducible_layers']} reducible, {p['key_heads']} key heads x {p['key_dim']}), hidden "
             f"{p['hidden_size']}, vocab {p['vocab_size']}; calibration {p['n_calib']} x {p['seq_len']} tokens, "
             f"batch {p['batch_size']} (Grad: {p['grad_batch_size']}), weights {p['weight_bytes']} bytes each"
             + (f" (embedding and head {p['vocab_bytes']})" if p["vocab_bytes"] != p["weight_bytes"] else "")]
    lines += [f"  {name:<22}{g(b)}" for name, b in p["terms"].items()]
    lines.append("  peak on the compute device:")
    lines += [f"    {name:<20}{g(b)}" for name, b in p["device"].items()]
    lines.append("  host memory (streamed; the all-at-once path holds the weights on the device):")
    lines += [f"    {name:<20}{g(b)}" for name, b in p["host"].items()]
    return "\n".join(lines)


def measure(path: str, n_calib: int = 8, seq_len: int = 256, batch_size: int = 4, seed: int = 0) -> dict:
    """Heap peaks (bytes above the loaded model) of calibration on CPU for a checkpoint, all at once and streamed,
    without and with gradients, on random token windows (memory does not depend on the tokens)."""
    install_cpu_backend()
    model = load_model(path)
    adapter = get_adapter(model)
    windows = torch.randint(0, model.config.vocab_size, (n_calib, seq_len),
                            generator=torch.Generator().manual_seed(seed))
    out = {}
    for name, fn in (("all_at_once", calibrate), ("streamed", calibrate_streaming)):
        for grad in (False, True):
            fn(model, adapter, windows[:batch_size], batch_size=batch_size, gradients=grad)  # warm up lazy state
            with HeapPeak() as peak:
                fn(model, adapter, windows, batch_size=batch_size, gradients=grad)
            out[f"{name}_{'grad' if grad else 'forward'}"] = peak.peak
    return out


def _cmd_memory_plan(args) -> int:
    config = build_config(args.model)
    weight_bytes = {"bfloat16": 2, "float32": 4}[args.dtype]
    p = plan(config, args.n_calib, args.seq_len, args.batch_size, weight_bytes, args.grad_tokens)
    arch = ARCHITECTURES.get(args.model)
    print(format_plan(p, arch.name if arch else args.model))
    if arch:
        print(f"  architecture source: {arch.source}")
    if args.measure:
        measured = measure(args.model, args.n_calib, args.seq_len, args.batch_size)
        p["measured_heap_peak"] = measured
        print(f"  measured heap peak on CPU above the loaded model (float32 checkpoint; "
              f"{args.n_calib} x {args.seq_len}, batch {args.batch_size}):")
        for name, b in measured.items():
            print(f"    {name:<20}{b / 2**20:8.1f} MiB")
    if args.out:
        write_json_atomic(args.out, {"model": args.model, **p})
        print(f"plan: {args.out}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("memory-plan", help="device and host memory of calibration, all at once and layer-streamed")
    p.add_argument("model", help=f"{', '.join([*ARCHITECTURES, *PRESETS])}, a checkpoint folder, a config.json "
                   "or a hub id")
    p.add_argument("--n-calib", type=int, default=128, help="calibration windows (paper profile: 128)")
    p.add_argument("--seq-len", type=int, default=2048, help="tokens per window (paper profile: 2048)")
    p.add_argument("--batch-size", type=int, default=1, help="windows per forward (paper profile: 1)")
    p.add_argument("--grad-tokens", type=int, default=2048,
                   help="Grad: tokens per forward (prune's grad_tokens; windows per forward = this // seq-len)")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16", help="weight dtype")
    p.add_argument("--measure", action="store_true",
                   help="also run calibration of the checkpoint on CPU and report measured heap peaks")
    p.add_argument("--out", default=None, help="write the plan as JSON")
    p.set_defaults(func=_cmd_memory_plan)
