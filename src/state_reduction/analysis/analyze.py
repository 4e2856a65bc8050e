"""`analyze`: rank utilisation of the recurrent states, subspace conditioning of a selection, channel overlap of
two selections, utilisation before vs after pruning, conv filter similarity; one `analyze` result.

The result's `extra` holds, per layer (keys are layer indices as strings):
  dense.states[layer]        d_k, d_v, divisor, u_mean, degenerate_heads, heads[h] = {er, u, u_std, spectrum
                             (mean sigma_i / sigma_1 over states), spectrum_raw, n_states, n_degenerate, degenerate,
                             u_by_position (mean u over sequences at each of `positions`, None where degenerate)},
                             positions (token counts at which the states are taken; Figure 3)
                             h runs over *state* heads (value heads: Qwen3.5's value heads share key heads)
  dense.conditioning         per_layer[layer][key head] = {sigma_min, sigma_max, kappa, degenerate}, median (Table 6)
  selection / compare        path, method, kept, conditioning (kept columns), states (after pruning; of
                             `selection_model` where given, e.g. the model after RFT), pearson_u
                             (Table 5 rho over all (layer, head)), utilization_summary (mean, std, min, max);
                             `selection_model` without a selection: that full-width model with every channel kept
                             (the dense+RFT control beside the dense model)
  overlap                    per_layer[layer][head] shared channels, median (appendix C.2)
  conv_similarity[layer]     q / k: within_head[h] mean cosine of channel filters, across_heads, dead_filters,
                             filters[h][channel] (the taps, for the Figure 7 heat map)
Scalar `metrics` (what claims read): u_mean, u_max_over_min (Table 5: heads are heterogeneous),
{sigma_min,sigma_max,kappa}_median_dense, conv_within_head_cosine / conv_across_heads_cosine
(Figure 7), and per role <role>_u_mean, _pearson_u, _kappa_median, _sigma_min_median, _sigma_max_median,
_spectral_gap_median (largest consecutive singular-value ratio of the reduced states, median over heads; Figures 5,
6), with dense_spectral_gap_median (the dense states' among as many values) beside a selection; overlap_median.
Degenerate heads (all-zero states or activations) are None with a flag; no metric is ever NaN."""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from state_reduction.analysis.conv import filter_similarity, qk_conv_filters
from state_reduction.analysis.rank import (
    check_divisor,
    effective_rank_from_singular_values,
    spectral_gap,
    utilization_divisor,
)
from state_reduction.analysis.selection import (
    LoadedSelection,
    as_key_channel_selections,
    channel_overlap,
    check_fits,
    full_selection,
    load_selection,
    median,
    pearson,
    subspace_conditioning,
)
from state_reduction.analysis.states import capture_kernel_inputs, states_at
from state_reduction.backend import install_cpu_backend
from state_reduction.checkpoints import load_config, load_model, load_tokenizer
from state_reduction.data import sample_sequences
from state_reduction.errors import InputError
from state_reduction.models.families import MODEL_TYPES, get_adapter
from state_reduction.pruning.calibration import calibrate
from state_reduction.pruning.surgery import reduce_model
from state_reduction.results import build_result, model_entry


@dataclass
class AnalyzeConfig:
    model: str
    selection: str | None = None
    compare: str | None = None
    # the reduced model analysed for `selection` (default: its own folder); without `selection`, a full-width model
    # analysed with every channel kept (the dense+RFT control beside the dense model it was fine-tuned from)
    selection_model: str | None = None
    calib: str = "ptb"
    stream: str = "calibration"  # Table 6 measures the activations the selectors saw; "evaluation" is held out
    n_calib: int = 4
    seq_len: int = 256
    seed: int = 0
    stride: int = 16  # states are analysed at every stride-th token
    divisor: str = "dk"  # see analysis/rank.py; "min" is the authors' min(d_k, d_v)
    ignore_decay: bool = False  # True reproduces the authors' delta-rule-only recurrence for gated models
    batch_size: int = 4
    data_dir: str | None = None


def recurrent_adapter(model_or_config, name: str):
    """The key-channel adapter, or an error naming the model type when the model has no recurrent layers."""
    try:
        return get_adapter(model_or_config)
    except KeyError:
        config = getattr(model_or_config, "config", model_or_config)
        raise InputError(
            f"analyze: {name} is a {getattr(config, 'model_type', None)!r} model without reducible recurrent "
            f"(linear-attention / SSM) layers; analyze supports {', '.join(MODEL_TYPES)}") from None


def state_statistics(model, adapter, windows: torch.Tensor, stride: int = 16, divisor: str = "dk",
                     batch_size: int = 4, ignore_decay: bool = False) -> dict[int, dict]:
    """Per layer and state head: mean er and u of S_t over sequences and sampled tokens, the spectrum
    sigma_i / sigma_1 averaged over the same states, and how many states were degenerate (all zero)."""
    check_divisor(divisor)
    acc: dict[int, dict] = {}

    def accumulate(layer, inputs) -> None:
        st = states_at(inputs, stride, ignore_decay=ignore_decay)  # [B, n, HV, K, V]
        d_k, d_v = st.shape[-2:]
        sv = torch.linalg.svdvals(st)  # [B, n, HV, r]
        er, degenerate = effective_rank_from_singular_values(sv)
        ok = (~degenerate).double()
        norm_sv = sv / sv[..., :1].clamp_min(1e-300) * ok[..., None]
        a = acc.setdefault(layer, {"d_k": d_k, "d_v": d_v, "er": 0, "er2": 0, "n": 0, "deg": 0, "spec": 0, "raw": 0,
                                   "pos_er": 0, "pos_n": 0, "positions": _positions(inputs.q.shape[1], stride)})
        a["pos_er"] = a["pos_er"] + (er * ok).sum(0)  # [n, HV]
        a["pos_n"] = a["pos_n"] + ok.sum(0)
        a["er"] = a["er"] + (er * ok).sum((0, 1))
        a["er2"] = a["er2"] + (er.square() * ok).sum((0, 1))
        a["n"] = a["n"] + ok.sum((0, 1))
        a["deg"] = a["deg"] + degenerate.sum((0, 1))
        a["spec"] = a["spec"] + norm_sv.sum((0, 1))
        a["raw"] = a["raw"] + (sv * ok[..., None]).sum((0, 1))

    for i in range(0, windows.shape[0], batch_size):
        capture_kernel_inputs(model, adapter, windows[i:i + batch_size], on_inputs=accumulate)
    out = {}
    for layer, a in sorted(acc.items()):
        d = utilization_divisor(a["d_k"], a["d_v"], divisor)
        heads = []
        for h in range(a["n"].shape[0]):
            n, deg = int(a["n"][h]), int(a["deg"][h])
            by_position = [round(float(e) / float(c) / d, 6) if c > 0 else None
                           for e, c in zip(a["pos_er"][:, h], a["pos_n"][:, h])]
            if n == 0:
                heads.append({"er": None, "u": None, "u_std": None, "spectrum": None, "spectrum_raw": None,
                              "n_states": 0, "n_degenerate": deg, "degenerate": True, "u_by_position": by_position})
                continue
            er_mean = float(a["er"][h]) / n
            er_var = max(float(a["er2"][h]) / n - er_mean ** 2, 0.0)
            heads.append({"er": er_mean, "u": er_mean / d, "u_std": er_var ** 0.5 / d,
                          "spectrum": [round(float(x) / n, 6) for x in a["spec"][h]],
                          "spectrum_raw": [round(float(x) / n, 6) for x in a["raw"][h]],
                          "n_states": n, "n_degenerate": deg, "degenerate": False, "u_by_position": by_position})
        us = [x["u"] for x in heads if x["u"] is not None]
        out[layer] = {"d_k": a["d_k"], "d_v": a["d_v"], "divisor": d, "heads": heads, "positions": a["positions"],
                      "u_mean": sum(us) / len(us) if us else None,
                      "degenerate_heads": [h for h, x in enumerate(heads) if x["degenerate"]]}
    return out


def _positions(t: int, stride: int) -> list[int]:
    """The token counts at which `states_at` takes the state: stride, 2*stride, ... and t."""
    ends = list(range(stride, t + 1, stride))
    return ends if ends and ends[-1] == t else ends + [t]


def _flat(stats: dict[int, dict], key: str = "u") -> list[float | None]:
    return [h[key] for layer in sorted(stats) for h in stats[layer]["heads"]]


def gap_median(stats: dict[int, dict], window: int) -> float | None:
    """Median over (layer, head) of the largest consecutive singular-value ratio among the first `window` (Figures
    5, 6: a spectral gap); degenerate heads are left out."""
    return median([spectral_gap(h["spectrum"], window)[0] for layer in sorted(stats) for h in stats[layer]["heads"]])


def conv_cosines(similarity: dict) -> dict:
    """Figure 7's summary: mean cosine of the q/k conv filters within a head and across heads, over layers, q and
    k (and heads); {} for a model without short convolutions."""
    within = [c for layer in similarity.values() for s in layer.values() for c in s["within_head"] if c is not None]
    across = [s["across_heads"] for layer in similarity.values() for s in layer.values() if s["across_heads"] is not None]
    return {"conv_within_head_cosine": sum(within) / len(within) if within else None,
            "conv_across_heads_cosine": sum(across) / len(across) if across else None}


def _summary(values: list[float | None]) -> dict:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"mean": None, "std": None, "min": None, "max": None, "n": 0}
    t = torch.tensor(vals, dtype=torch.float64)
    return {"mean": float(t.mean()), "std": float(t.std(unbiased=False)), "min": float(t.min()),
            "max": float(t.max()), "n": len(vals)}


def conditioning(calibration: dict, keep: dict[int, torch.Tensor] | None) -> dict:
    """Table 6 per layer and head, and the medians over all heads (kappa: median of per-head ratios)."""
    per_layer = {}
    for layer, s in sorted(calibration.items()):
        gram = s.gram_q + s.gram_k  # M^T M with M = [Q; K], 2N rows
        per_layer[layer] = subspace_conditioning(gram, 2 * s.n_tokens, None if keep is None else keep[layer])
    heads = [h for layer in per_layer.values() for h in layer]
    return {"per_layer": {str(k): v for k, v in per_layer.items()},
            "median": {k: median([h[k] for h in heads]) for k in ("sigma_min", "sigma_max", "kappa")},
            "degenerate_heads": sum(h["degenerate"] for h in heads)}


def check_reduced(model, adapter, path: str, selection: LoadedSelection) -> None:
    """The reduced model analysed for a selection must keep as many key channels per head as the selection."""
    heads, key_dim = adapter.key_heads(model.config)
    if (heads, key_dim) != (selection.key_heads, selection.kept):
        raise InputError(f"analyze: model {path} has {heads} key heads x {key_dim} channels, but selection "
                         f"{selection.path} keeps {selection.key_heads} x {selection.kept}")


def _load(path: str):
    adapter = recurrent_adapter(load_config(path), path)
    model = load_model(path)
    model.eval()
    return model, adapter


def analyze(cfg: AnalyzeConfig, *, profile: str = "tiny", experiment: str = "analysis") -> dict:
    check_divisor(cfg.divisor)
    if cfg.compare and not cfg.selection:
        raise InputError("analyze: --compare OTHER needs --selection (the overlap is between the two)")
    t0 = time.time()
    install_cpu_backend()
    model, adapter = _load(cfg.model)
    H, K = adapter.key_heads(model.config)
    layers = [r.layer for r in adapter.mixers(model)]
    selections: list[LoadedSelection] = []
    for path in filter(None, (cfg.selection, cfg.compare)):
        sel = load_selection(path)
        check_fits(sel, cfg.model, model.config.model_type, layers, H, K)
        selections.append(sel)
    if cfg.selection_model and not cfg.selection:  # a full-width model (the dense+RFT control): every channel kept
        selections.append(full_selection(cfg.selection_model, model.config.model_type, layers, H, K))

    tokenizer = load_tokenizer(cfg.model)
    windows = sample_sequences(tokenizer, cfg.calib, n=cfg.n_calib, seq_len=cfg.seq_len, seed=cfg.seed,
                               stream=cfg.stream, data_dir=cfg.data_dir)
    kw = {"stride": cfg.stride, "divisor": cfg.divisor, "batch_size": cfg.batch_size, "ignore_decay": cfg.ignore_decay}
    dense = state_statistics(model, adapter, windows, **kw)
    calibration = calibrate(model, adapter, windows, batch_size=cfg.batch_size)
    extra = {"model_type": model.config.model_type, "key_heads": H, "key_dim": K, "layers": layers,
             "divisor": cfg.divisor, "decay": not cfg.ignore_decay,
             "dense": {"states": {str(k): v for k, v in dense.items()}, "conditioning": conditioning(calibration, None)},
             "conv_similarity": {}}
    spread = _summary(_flat(dense))
    metrics = {"u_mean": spread["mean"],
               "u_max_over_min": spread["max"] / spread["min"] if spread["n"] and spread["min"] > 0 else None,
               "u_per_layer": {str(k): v["u_mean"] for k, v in dense.items()},
               **{f"{k}_median_dense": v for k, v in extra["dense"]["conditioning"]["median"].items()},
               "degenerate_heads": sum(len(v["degenerate_heads"]) for v in dense.values())}
    extra["utilization_summary"] = {"dense": _summary(_flat(dense))}
    for ref in adapter.mixers(model):
        filters = qk_conv_filters(adapter, ref.module)
        if filters is not None:
            extra["conv_similarity"][str(ref.layer)] = {
                name: {**filter_similarity(f), "filters": [[[round(float(x), 6) for x in ch] for ch in head] for head in f]}
                for name, f in zip("qk", filters)}
    metrics.update(conv_cosines(extra["conv_similarity"]))

    for role, sel in zip(("selection", "compare"), selections):
        cond = conditioning(calibration, sel.keep)
        reduced = cfg.selection_model if role == "selection" and cfg.selection_model else sel.model_dir
        if reduced is not None:
            pruned, _ = _load(reduced)
            check_reduced(pruned, adapter, reduced, sel)
        else:
            pruned = reduce_model(copy.deepcopy(model), as_key_channel_selections(sel))
        after = state_statistics(pruned, adapter, windows, **kw)
        rho = pearson(_flat(dense), _flat(after))
        extra[role] = {"path": sel.path, "method": sel.method, "kept": sel.kept, "model_dir": reduced,
                       "conditioning": cond, "states": {str(k): v for k, v in after.items()},
                       "pearson_u": rho, "utilization_summary": _summary(_flat(after))}
        metrics[f"{role}_u_mean"] = extra[role]["utilization_summary"]["mean"]
        metrics[f"{role}_pearson_u"] = rho
        metrics[f"{role}_kappa_median"] = cond["median"]["kappa"]
        metrics[f"{role}_sigma_min_median"] = cond["median"]["sigma_min"]
        metrics[f"{role}_sigma_max_median"] = cond["median"]["sigma_max"]
        metrics[f"{role}_spectral_gap_median"] = gap_median(after, sel.kept)
        if role == "selection":  # the dense states' gap among as many values as the reduced state has
            metrics["dense_spectral_gap_median"] = gap_median(dense, sel.kept)
    if len(selections) == 2:
        overlap = channel_overlap(selections[0].keep, selections[1].keep)
        flat = [float(x) for v in overlap.values() for x in v]
        extra["overlap"] = {"per_layer": {str(k): v for k, v in overlap.items()}, "median": median(flat),
                            "kept": [selections[0].kept, selections[1].kept]}
        metrics["overlap_median"] = median(flat)

    data = {"calibration": {"corpus": cfg.calib, "stream": cfg.stream, "n": cfg.n_calib, "seq_len": cfg.seq_len,
                            "seed": cfg.seed, "tokens": int(windows.numel())}}
    return build_result("analyze", profile=profile, experiment=experiment, config=asdict(cfg), metrics=metrics,
                        model=model_entry(Path(cfg.model)), data=data, seeds={"calibration": cfg.seed},
                        wall_time_s=time.time() - t0, extra=extra)
