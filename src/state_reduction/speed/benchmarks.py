"""The speed benchmarks of paper G.1 (Tables 17-19, Figure 4) and the CPU recurrence target.

Every benchmark measures the baseline and its reduced variants side by side in one process
(`timing.time_interleaved`); a speedup is the median over repetitions of the paired ratio (`timing.paired_speedup`),
a time the median over repetitions. It returns a result record (`results.build_result(kind="bench")`); the rows of the
table are in `extra["rows"]`. Backends: fla's Triton kernels on CUDA, the project's torch references on CPU
(`install_cpu_backend`); a result names its device and backend and is never mixed with the other.
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
from dataclasses import asdict

import fla.layers.gated_deltanet as layer_module
import torch
from fla.layers import GatedDeltaNet
from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
from torch import nn

from state_reduction.allocator import AllocatorError, heap_only
from state_reduction.backend import install_cpu_backend, recurrent_gated_delta_rule_torch
from state_reduction.backend.fused_cpu import KERNELS, use_kernel
from state_reduction.errors import Error
from state_reduction.models.families import get_adapter
from state_reduction.peak_memory import measure_peak_bytes
from state_reduction.pruning.adapters.gated_deltanet import expand_v_for
from state_reduction.pruning.selectors import keep_count
from state_reduction.results import build_result, model_entry
from state_reduction.speed.models import (
    backend_label,
    check_device,
    load_bench_model,
    reduced_copy,
)
from state_reduction.speed.timing import (
    TimingProtocol,
    median,
    paired_speedup,
    time_interleaved,
)

# Table 19 shape and the CPU recurrence target's shape (issue 7)
MIXER_SHAPE = {"hidden_size": 2048, "num_heads": 16, "d_v": 128, "seq_len": 2048}
RECURRENCE_SHAPE = {"batch": 64, "num_heads": 16, "d_v": 128}


PAPER_PROTOCOL = TimingProtocol()  # 10 warm-up, 100 measured, median of 3 (paper G.1)
RECURRENCE_PROTOCOL = TimingProtocol(3, 20, 5)
MODEL_STEP_PROTOCOL = TimingProtocol(1, 3, 3)
QUICK_PROTOCOL = TimingProtocol(1, 2, 3)


class BenchError(Error, ValueError):
    """Bad benchmark input (device, CUDA graphs, sizes); the message names the argument."""


def hardware_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    return f"CPU: {name} ({torch.get_num_threads()} torch thread{'s' if torch.get_num_threads() != 1 else ''})"


def resolve_device(device: str | torch.device) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BenchError(f"device {device} requested but CUDA is not available on this machine")
    if device.type not in ("cpu", "cuda"):
        raise BenchError(f"device must be cpu or cuda, got {device}")
    if device.type == "cpu":
        install_cpu_backend()
    return device


def resolve_cuda_graphs(cuda_graphs: str | bool | None, device: torch.device) -> bool:
    """'auto'/None: on for CUDA, off for CPU. Asking for them on CPU is an error: CUDA graphs replay recorded
    CUDA kernel launches; CPU ops are not recorded, so there is nothing to capture."""
    if cuda_graphs in (None, "auto"):
        return device.type == "cuda"
    on = cuda_graphs in (True, "on", "true", "1")
    if on and device.type != "cuda":
        raise BenchError(f"CUDA graphs requested on {device}: a CUDA graph records CUDA kernel launches and "
                         f"the CPU backend launches none; run on a CUDA device or pass --cuda-graphs off")
    return on


def variants(K: int, ratios=(0.5, 0.75), keeps=()) -> list[tuple[str, int]]:
    """[(label, kept channels)], baseline first: 'base', 'r50' for ratio 0.5, 'k77' for an explicit count."""
    out = [("base", K)]
    for r in ratios:
        out.append((f"r{round(r * 100)}", keep_count(K, r)))
    for k in keeps:
        if not (isinstance(k, int) and 1 <= k <= K):
            raise BenchError(f"--keep {k}: kept channels must be in [1, {K}]")
        out.append((f"k{k}", k))
    seen, unique = set(), []
    for label, k in out:
        if label not in seen:
            seen.add(label)
            unique.append((label, k))
    return unique


def _record(mode: str, *, profile: str, config: dict, rows: list[dict], metrics: dict, device: torch.device,
            wall: float, model: dict | None = None, extra: dict | None = None) -> dict:
    config = {**config, "mode": mode, "device": device.type, "backend": backend_label(device),
              "torch_threads": torch.get_num_threads()}
    return build_result("bench", profile=profile, experiment="speed", config=config, metrics=metrics, model=model,
                        wall_time_s=wall, extra={"mode": mode, "hardware": hardware_name(device),
                                                 "backend": backend_label(device), "rows": rows, **(extra or {})})


def use_heap_allocations() -> str:
    """glibc: serve large blocks from the heap instead of a fresh mmap each (`allocator.heap_only`). By default every
    freed block above 32 MiB (a [64, 16, 128, 128] fp32 state is 64 MiB) is unmapped and the next one page-faults
    back in, so the torch reference's decode step then measures the kernel's page faults as much as state traffic."""
    try:
        return heap_only()
    except AllocatorError as e:
        raise BenchError(str(e)) from None


def amdahl(share: float, speedup: float) -> float:
    """Whole-program speedup when a part taking `share` of the time becomes `speedup` times faster."""
    return 1.0 / ((1.0 - share) + share / speedup)


# ---------------------------------------------------------------------------------------------------------------
# recurrence / layer / model: the CPU target (one decode step)

def _recurrence_fn(device: torch.device):
    if device.type == "cuda":
        return fused_recurrent_gated_delta_rule

    return recurrent_gated_delta_rule_torch


def _recurrence_inputs(B: int, H: int, K: int, V: int, device, dtype, seed: int) -> dict:
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    # the options fla's GatedDeltaNet layer passes in decode (fused_recurrent mode); state [B, H, V, K]
    return {"q": rnd(B, 1, H, K), "k": rnd(B, 1, H, K), "v": rnd(B, 1, H, V), "g": rnd(B, 1, H), "beta": rnd(B, 1, H),
                "initial_state": rnd(B, H, V, K).float() * 0.1, "output_final_state": True, "use_qk_l2norm_in_kernel": True,
                "use_gate_in_kernel": True, "A_log": torch.zeros(H, device=device), "dt_bias": torch.zeros(H, device=device),
                "use_beta_sigmoid_in_kernel": True, "state_v_first": True}


@contextlib.contextmanager
def _time_recurrence_calls(device: torch.device):
    """Accumulate the wall time spent in the gated-delta-rule recurrence that fla's layer calls in decode."""
    original = layer_module.fused_recurrent_gated_delta_rule
    box = {"seconds": 0.0, "calls": 0}

    def timed(*args, **kwargs):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        out = original(*args, **kwargs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        box["seconds"] += time.perf_counter() - t0
        box["calls"] += 1
        return out

    layer_module.fused_recurrent_gated_delta_rule = timed
    try:
        yield box
    finally:
        layer_module.fused_recurrent_gated_delta_rule = original


def _share(step, device, protocol: TimingProtocol) -> float:
    """Fraction of a decode step's time spent in the recurrence: median over `protocol.repeats` repetitions of
    `protocol.steps` steps, in a pass of its own (its timers synchronise the GPU)."""
    for _ in range(max(1, protocol.warmup)):
        step()
    shares = []
    for _ in range(protocol.repeats):
        with _time_recurrence_calls(device) as box:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            for _ in range(protocol.steps):
                step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            total = time.perf_counter() - t0
        shares.append(box["seconds"] / total)
    return median(shares)


def bench_recurrence(*, device="cpu", batch: int = 64, num_heads: int = 16, d_v: int = 128, d_k: int = 128,
                     ratios=(0.5, 0.75), model: str = "gdn-1.3b", layers: int = 2, prompt_len: int = 16,
                     protocol: TimingProtocol = RECURRENCE_PROTOCOL, model_protocol: TimingProtocol = MODEL_STEP_PROTOCOL,
                     levels=("recurrence", "layer", "model"), malloc_heap: bool = False, profile: str = "tiny",
                     seed: int = 0, kernel: str = "torch") -> dict:
    """One decode step at three levels, baseline vs reduced d_k: the recurrence alone (state update + readout),
    one Gated DeltaNet mixer layer (projections, conv, gate, norm, o_proj), and a 1.3B-shaped model with `layers`
    layers. The layer and model levels report the recurrence's measured share s of the baseline step and the
    Amdahl bound 1 / ((1 - s) + s / (d_k / d_k')) that an ideal d_k-proportional recurrence would give. On CPU
    `kernel` picks the decode step: `torch` (the reference) or `fused` (backend.fused_cpu, one pass per head)."""
    t_start = time.perf_counter()
    device = resolve_device(device)
    if kernel not in KERNELS or (kernel != "torch" and device.type != "cpu"):
        raise BenchError(f"bench recurrence: --kernel must be one of {', '.join(KERNELS)} (fused: CPU only), "
                         f"got {kernel!r} on {device.type}")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # as the models run; states stay fp32
    unknown = set(levels) - {"recurrence", "layer", "model"}
    if unknown or not levels:
        raise BenchError(f"levels must be a non-empty subset of recurrence, layer, model; got {list(levels)}")
    malloc = use_heap_allocations() if malloc_heap and device.type == "cpu" else "default"
    vs = variants(d_k, ratios)
    rows, metrics = [], {}
    with torch.no_grad(), use_kernel(kernel if device.type == "cpu" else "torch"):
        if "recurrence" in levels:
            fn = _recurrence_fn(device)
            inputs = {label: _recurrence_inputs(batch, num_heads, k, d_v, device, dtype, seed) for label, k in vs}
            # the traffic bound, measured in the same run: one copy of a state-sized buffer (read it once, write it
            # once) is the least memory traffic a state update can make
            buffers = {label: (x["initial_state"], torch.empty_like(x["initial_state"])) for label, x in inputs.items()}
            fns = {label: (lambda x=inputs[label]: fn(**x)) for label, _ in vs}
            fns.update({f"copy_{label}": (lambda b=buffers[label]: b[1].copy_(b[0])) for label, _ in vs})
            samples = time_interleaved(fns, protocol, device)
            rows += _level_rows("recurrence", vs, samples, d_k, share=1.0)
            for r in rows:
                copies = samples[f"copy_{r['label']}"]
                r["copy_ms"] = median(copies) * 1e3
                r["traffic_bound_multiple"] = median(t / c for t, c in zip(samples[r["label"]], copies, strict=True))
        if "layer" in levels or "model" in levels:
            if model not in ("gdn-1.3b",) and not os.path.isdir(model):
                raise BenchError(f"recurrence levels layer/model need a Gated DeltaNet model, got {model!r}")
            base, desc = load_bench_model(model, layers=layers if model == "gdn-1.3b" else None, device=device,
                                          dtype=dtype, seed=seed)
            models = {label: (base if k == d_k else reduced_copy(base, k)) for label, k in vs}
            vocab = base.config.vocab_size
            prompt = torch.randint(0, vocab, (batch, prompt_len), generator=torch.Generator().manual_seed(seed)).to(device)
            token = prompt[:, -1:]
            caches = {label: m(input_ids=prompt, use_cache=True).past_key_values for label, m in models.items()}
            if "layer" in levels:
                hidden = torch.randn(batch, 1, base.config.hidden_size,
                                     generator=torch.Generator().manual_seed(seed)).to(device, dtype)
                steps = {label: (lambda m=m, c=caches[label]: m.model.layers[0].attn(hidden, past_key_values=c, use_cache=True))
                         for label, m in models.items()}
                share = _share(steps["base"], device, protocol)
                samples = time_interleaved(steps, protocol, device)
                rows += _level_rows("layer", vs, samples, d_k, share=share)
            if "model" in levels:
                steps = {label: (lambda m=m, c=caches[label]: m(input_ids=token, past_key_values=c, use_cache=True))
                         for label, m in models.items()}
                share = _share(steps["base"], device, model_protocol)
                samples = time_interleaved(steps, model_protocol, device)
                rows += _level_rows("model", vs, samples, d_k, share=share, layers=desc["layers"])
    for r in rows:
        if "traffic_bound_multiple" in r:
            metrics[f"{r['level']}_traffic_bound_multiple_{r['label']}"] = r["traffic_bound_multiple"]
        if r["label"] != "base":
            metrics[f"{r['level']}_speedup_{r['label']}"] = r["speedup"]
            metrics[f"{r['level']}_amdahl_bound_{r['label']}"] = r["amdahl_bound"]
        else:
            metrics[f"{r['level']}_ms_base"] = r["ms"]
            metrics[f"{r['level']}_recurrence_share"] = r["recurrence_share"]
    config = {"batch": batch, "num_heads": num_heads, "d_v": d_v, "d_k": d_k, "ratios": list(ratios), "model": model, "layers": layers,
                  "prompt_len": prompt_len, "levels": list(levels), "protocol": asdict(protocol),
                  "model_protocol": asdict(model_protocol), "seed": seed, "dtype": str(dtype).removeprefix("torch."),
              "malloc": malloc, "kernel": kernel}
    with use_kernel(kernel if device.type == "cpu" else "torch"):  # the backend label names the kernel
        return _record("recurrence", profile=profile, config=config, rows=rows, metrics=metrics, device=device,
                       wall=time.perf_counter() - t_start)


def _level_rows(level: str, vs, samples: dict, K: int, share: float, **more) -> list[dict]:
    rows = []
    for label, k in vs:
        ms = median(samples[label]) * 1e3
        bound = K / k
        rows.append({"level": level, "label": label, "d_k": k, "ratio": round(1 - k / K, 6), "ms": ms,
                     "samples_ms": [s * 1e3 for s in samples[label]], "speedup": paired_speedup(samples, label),
                     "state_bound": bound, "recurrence_share": share, "amdahl_bound": amdahl(share, bound), **more})
    return rows


# ---------------------------------------------------------------------------------------------------------------
# mixer: one sequence-mixer layer, prefill (Table 19)

def build_mixer(d_k: int, *, hidden_size: int, num_heads: int, d_v: int, device, dtype, seed: int = 0) -> nn.Module:
    """A Gated DeltaNet layer with `d_k` key channels per head and value heads of `d_v` (random weights)."""
    torch.manual_seed(seed)
    layer = GatedDeltaNet(hidden_size=hidden_size, head_dim=d_k, num_heads=num_heads,
                          expand_v=expand_v_for(d_v, d_k, num_heads), mode="chunk", layer_idx=0)
    if layer.head_v_dim != d_v:
        raise BenchError(f"mixer with d_k {d_k}: fla built d_v {layer.head_v_dim}, not {d_v}")
    return layer.to(device=device, dtype=dtype).eval()


def bench_mixer(*, device="cpu", batches=(1, 2), seq_len: int = 512, hidden_size: int = 2048, num_heads: int = 16,
                d_v: int = 128, d_k: int = 128, ratios=(0.5, 0.75), keeps=(96, 80, 77), dtype: torch.dtype | None = None,
                protocol: TimingProtocol = QUICK_PROTOCOL, profile: str = "tiny", seed: int = 0) -> dict:
    """Prefill through one Gated DeltaNet mixer alone (Table 19; paper: T 2048, batch 8/16/32), baseline vs reduced
    d_k: time and peak memory ratio. `keeps` adds explicit budgets (77 = an unrounded 60% of 128: fla pads K to
    the next power of two on GPU, the CPU reference does not pad)."""
    t_start = time.perf_counter()
    device = resolve_device(device)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    vs = variants(d_k, ratios, keeps)
    rows, metrics = [], {}
    with torch.no_grad():
        layers = {label: build_mixer(k, hidden_size=hidden_size, num_heads=num_heads, d_v=d_v, device=device,
                                     dtype=dtype, seed=seed) for label, k in vs}
        for B in batches:
            x = torch.randn(B, seq_len, hidden_size, generator=torch.Generator().manual_seed(seed)).to(device, dtype)
            fns = {label: (lambda layer=layer, x=x: layer(x)) for label, layer in layers.items()}
            if device.type == "cuda":  # compile and autotune first: the autotuner's trial runs are not the layer's peak
                for fn in fns.values():
                    fn()
            peaks = {label: measure_peak_bytes(fn, device) for label, fn in fns.items()}
            samples = time_interleaved(fns, protocol, device)
            for label, k in vs:
                ms = median(samples[label]) * 1e3
                row = {"batch": B, "seq_len": seq_len, "label": label, "d_k": k, "d_k_padded": 1 << (k - 1).bit_length(),
                       "ratio": round(1 - k / d_k, 6), "ms": ms, "samples_ms": [s * 1e3 for s in samples[label]],
                       "speedup": paired_speedup(samples, label), "peak_bytes": peaks[label],
                       "peak_ratio": peaks[label] / peaks["base"] if peaks["base"] else None}
                rows.append(row)
                if label != "base":
                    metrics[f"speedup_b{B}_{label}"] = row["speedup"]
                    metrics[f"peak_ratio_b{B}_{label}"] = row["peak_ratio"]
    config = {"batches": list(batches), "seq_len": seq_len, "hidden_size": hidden_size, "num_heads": num_heads, "d_v": d_v,
                  "d_k": d_k, "ratios": list(ratios), "keeps": list(keeps), "dtype": str(dtype).removeprefix("torch."),
                  "protocol": asdict(protocol), "seed": seed}
    return _record("mixer", profile=profile, config=config, rows=rows, metrics=metrics, device=device,
                   wall=time.perf_counter() - t_start,
                   extra={"peak_memory_method": "torch.cuda.max_memory_allocated" if device.type == "cuda"
                          else "live CPU tensor storages allocated in the forward (TorchDispatchMode)"})


# ---------------------------------------------------------------------------------------------------------------
# decode: full model, tokens/s after a prompt (Table 17, Figure 4a)

def _graphed(step, device: torch.device):
    """Capture `step` (a decode step with static inputs) in a CUDA graph and return its replay. Replays recompute
    the captured step from the same cache tensors: the same work per token as eager decode."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def _load_models(model: str, ratios, keeps, *, device, dtype, layers, seed) -> tuple[dict, list, dict]:
    base, desc = load_bench_model(model, layers=layers, device=device, dtype=dtype, seed=seed)
    vs = variants(desc["d_k"], ratios, keeps)
    models = {label: (base if k == desc["d_k"] else reduced_copy(base, k)) for label, k in vs}
    return models, vs, desc


def _prepare_models(what, model, models, ratios, keeps, device, dtype, layers, seed):
    """(models, [(label, d_k)], description): loaded from `model` unless given, all checked to be on `device`."""
    if models is None:
        models, vs, desc = _load_models(model, ratios, keeps, device=device, dtype=dtype, layers=layers, seed=seed)
    else:
        vs = [(label, get_adapter(m).key_heads(m.config)[1]) for label, m in models.items()]
        desc = {"name": model, "d_k": vs[0][1]}
    for label, m in models.items():
        check_device(m, device, f"bench {what} ({label})")
    return models, vs, desc


def bench_decode(model: str, *, device="cpu", batches=(1, 2, 4, 8, 16, 32, 64), prompt_len: int = 512,
                 ratios=(0.5, 0.75), keeps=(), layers: int | None = None, dtype: torch.dtype | None = None,
                 cuda_graphs: str | bool | None = "auto", protocol: TimingProtocol = PAPER_PROTOCOL,
                 models: dict | None = None, profile: str = "tiny", seed: int = 0) -> dict:
    """Full-model decode after a `prompt_len` prompt: ms/token and tokens/s per batch size, baseline and reduced
    side by side. `models` ({label: model}) benchmarks given models instead of loading `model`; they must already
    be on `device`."""
    t_start = time.perf_counter()
    device = resolve_device(device)
    graphs = resolve_cuda_graphs(cuda_graphs, device)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    models, vs, desc = _prepare_models("decode", model, models, ratios, keeps, device, dtype, layers, seed)
    rows, metrics, notes = [], {}, []
    vocab = next(iter(models.values())).config.vocab_size
    with torch.no_grad():
        for B in batches:
            prompt = torch.randint(0, vocab, (B, prompt_len), generator=torch.Generator().manual_seed(seed)).to(device)
            token = prompt[:, -1:].clone()
            steps = {}
            for label, m in models.items():
                cache = m(input_ids=prompt, use_cache=True, logits_to_keep=1).past_key_values
                step = (lambda m=m, c=cache, t=token: m(input_ids=t, past_key_values=c, use_cache=True))
                if graphs:
                    try:
                        step = _graphed(step, device)
                    except Exception as e:  # noqa: BLE001  (capture support is fla-version dependent: record, run eagerly)
                        notes.append(f"batch {B} {label}: CUDA graph capture failed ({type(e).__name__}: {e}); eager")
                steps[label] = step
            samples = time_interleaved(steps, protocol, device)
            for label, k in vs:
                ms = median(samples[label]) * 1e3
                speedup = paired_speedup(samples, label)
                rows.append({"batch": B, "label": label, "d_k": k, "ratio": round(1 - k / desc["d_k"], 6),
                             "ms_per_token": ms, "tokens_per_s": B * 1e3 / ms,
                             "samples_ms": [s * 1e3 for s in samples[label]], "speedup": speedup})
                metrics[f"ms_per_token_b{B}_{label}"] = ms
                if label != "base":
                    metrics[f"speedup_b{B}_{label}"] = speedup
            del steps
    config = {"model": desc.get("name", model), "layers": desc.get("layers"), "batches": list(batches), "prompt_len": prompt_len,
                  "ratios": list(ratios), "keeps": list(keeps), "dtype": str(dtype).removeprefix("torch."), "cuda_graphs": graphs,
                  "protocol": asdict(protocol), "seed": seed}
    return _record("decode", profile=profile, config=config, rows=rows, metrics=metrics, device=device,
                   wall=time.perf_counter() - t_start, model=_model_entry(desc),
                   extra={"model": desc, "notes": notes})


def _model_entry(desc: dict) -> dict | None:
    if desc.get("path"):
        return model_entry(desc["path"])
    return {"path": None, "weights_sha256": None, "preset": desc.get("name"), "random_weights": True}


# ---------------------------------------------------------------------------------------------------------------
# prefill: full model, B x T grid (Table 18, Figure 4b)

def available_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise BenchError("cannot read MemAvailable from /proc/meminfo; pass --memory-budget")


def _is_oom(e: BaseException) -> bool:
    text = str(e).lower()
    return (isinstance(e, (torch.OutOfMemoryError, MemoryError)) or "out of memory" in text
            or "can't allocate memory" in text)


def bench_prefill(model: str, *, device="cpu", grid=((1, 128), (2, 128), (1, 512)), ratios=(0.5, 0.75),
                  keeps=(), layers: int | None = None, dtype: torch.dtype | None = None,
                  memory_budget: int | None = None, protocol: TimingProtocol = QUICK_PROTOCOL,
                  models: dict | None = None, profile: str = "tiny", seed: int = 0) -> dict:
    """Full-model prefill (chunked kernels, last-token logits) over a grid of (B, T) cells, baseline and reduced
    side by side. Before a cell runs, its peak activation memory is estimated from a measured reference cell
    (activations of chunked prefill grow linearly with B * T); a cell whose estimate exceeds the budget (default:
    free device memory now) is skipped with the reason, and so is one that runs out of memory; the grid goes on."""
    t_start = time.perf_counter()
    device = resolve_device(device)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    grid = [(int(b), int(t)) for b, t in grid]
    if not grid or any(b < 1 or t < 1 for b, t in grid):
        raise BenchError(f"prefill grid cells need B >= 1 and T >= 1, got {grid}")
    models, vs, desc = _prepare_models("prefill", model, models, ratios, keeps, device, dtype, layers, seed)
    budget = memory_budget if memory_budget is not None else available_memory(device)
    vocab = next(iter(models.values())).config.vocab_size
    rows, skipped, metrics = [], [], {}

    def run(m, ids):
        return m(input_ids=ids, use_cache=False, logits_to_keep=1)

    with torch.no_grad():
        ref_b, ref_t = min(grid, key=lambda c: (c[0] * c[1], c))
        ref_ids = torch.randint(0, vocab, (ref_b, ref_t), generator=torch.Generator().manual_seed(seed)).to(device)
        ref_peak = measure_peak_bytes(lambda: run(models["base"], ref_ids), device)
        per_token = ref_peak / (ref_b * ref_t)
        for B, T in grid:
            estimate = int(per_token * B * T)
            cell = {"batch": B, "seq_len": T, "estimated_peak_bytes": estimate, "budget_bytes": budget}
            if estimate > budget:
                skipped.append({**cell, "reason": f"estimated peak {estimate / 2**30:.2f} GiB exceeds the memory "
                                                  f"budget {budget / 2**30:.2f} GiB"})
                continue
            ids = torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed)).to(device)
            try:
                samples = time_interleaved({label: (lambda m=m, ids=ids: run(m, ids)) for label, m in models.items()},
                                           protocol, device)
            except (RuntimeError, MemoryError) as e:
                if not _is_oom(e):
                    raise
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                skipped.append({**cell, "reason": f"out of memory: {type(e).__name__}: {str(e)[:200]}"})
                continue
            for label, k in vs:
                ms = median(samples[label]) * 1e3
                speedup = paired_speedup(samples, label)
                rows.append({**cell, "label": label, "d_k": k, "ratio": round(1 - k / desc["d_k"], 6), "ms": ms,
                             "tokens_per_s": B * T * 1e3 / ms, "samples_ms": [s * 1e3 for s in samples[label]],
                             "speedup": speedup})
                if label != "base":
                    metrics[f"speedup_b{B}_t{T}_{label}"] = speedup
    config = {"model": desc.get("name", model), "layers": desc.get("layers"), "grid": [list(c) for c in grid],
                  "ratios": list(ratios), "keeps": list(keeps), "dtype": str(dtype).removeprefix("torch."),
                  "memory_budget": memory_budget, "protocol": asdict(protocol), "seed": seed}
    return _record("prefill", profile=profile, config=config, rows=rows, metrics=metrics, device=device,
                   wall=time.perf_counter() - t_start, model=_model_entry(desc),
                   extra={"model": desc, "skipped": skipped,
                          "memory_estimate": {"reference_cell": [ref_b, ref_t], "reference_peak_bytes": ref_peak,
                                              "bytes_per_token": per_token}})
