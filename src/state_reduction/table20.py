"""The runs behind Table 20 on the tiny profile: each committed checkpoint dense, and pruned to 50% with
each of the paper's five methods (pre-RFT), evaluated by held-out token perplexity. One result JSON per
cell, keyed by the cell's configuration and the weights it was measured on, so a rerun skips what is
done and a killed sweep resumes at the first missing cell."""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from state_reduction.provenance import REPO_ROOT, collect_provenance, write_json_atomic

TINY_CHECKPOINTS = REPO_ROOT / "experiments" / "tiny_models" / "checkpoints"
TINY_FAMILIES = ("deltanet", "gated_deltanet", "mamba2", "qwen3_5")
TABLE20_METHODS = ("l1", "rand", "drrqr", "grad", "wanda")
PPL_CORPORA = {"wiki": "wiki", "ptb": "ptb"}  # column -> tiny corpus (wiki: the WikiText stand-in)


@dataclass(frozen=True)
class Table20Settings:
    ratio: float = 0.5
    calib: str = "ptb"
    n_calib: int = 32
    calib_seq_len: int = 256
    seed: int = 0
    eval_seq_len: int = 256
    eval_batch_size: int = 16


def weights_sha256(checkpoint: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(checkpoint.glob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()


def _cell_key(cell: dict) -> str:
    return hashlib.sha256(json.dumps(cell, sort_keys=True).encode()).hexdigest()[:16]


def _perplexities(model_dir: Path, settings: Table20Settings, data_dir=None) -> tuple[dict, dict]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from state_reduction.data import get_corpus_info
    from state_reduction.data.sampler import stream_tokens
    from state_reduction.training.pretrain import window_nll

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    metrics, data = {}, {}
    for column, corpus in PPL_CORPORA.items():
        tokens = torch.from_numpy(stream_tokens(tok, corpus, "evaluation", split="test", data_dir=data_dir))
        nll = window_nll(model, tokens, settings.eval_seq_len, settings.eval_batch_size, desc=f"{model_dir.name} {corpus}")
        metrics[f"{column}_ppl"] = math.exp(nll.double().mean().item())
        metrics[f"{column}_tokens"] = int(nll.numel())
        data[corpus] = get_corpus_info(corpus).sha256
    return metrics, data


def run_table20(profile: str, out_dir: Path, settings: Table20Settings = Table20Settings(),
                methods=TABLE20_METHODS, families=TINY_FAMILIES, data_dir=None) -> list[Path]:
    if profile != "tiny":
        raise NotImplementedError(
            f"profile {profile!r}: Table 20 on the paper profile needs the lm-eval suite and RFT (not built yet); "
            "run `make table20` (PROFILE=tiny)")
    import state_reduction  # noqa: F401
    from state_reduction.backend import install_cpu_backend
    from state_reduction.pruning.prune import PruneConfig, prune

    install_cpu_backend()
    out_dir = Path(out_dir)
    dense_sha256 = {}
    for family in families:
        ckpt = TINY_CHECKPOINTS / family
        if not (ckpt / "config.json").is_file():
            raise FileNotFoundError(f"tiny checkpoint {ckpt} is missing; run `make tiny-models`")
        dense_sha256[family] = weights_sha256(ckpt)
    cells = [(f, m) for f in families for m in ("baseline", *methods)]
    written = []
    for family, method in tqdm(cells, desc="table20 cells"):
        ckpt = TINY_CHECKPOINTS / family
        ratio = 0.0 if method == "baseline" else settings.ratio
        cell = {"family": family, "method": method, "ratio": ratio, "rft": False,
                "settings": settings.__dict__, "dense_weights_sha256": dense_sha256[family]}
        key = _cell_key(cell)
        out = out_dir / f"{family}-{method}-r{round(ratio * 100)}.json"
        if out.exists() and json.loads(out.read_text()).get("cell_key") == key:
            written.append(out)
            continue
        t0 = time.time()
        model_dir, prune_record = ckpt, None
        if method != "baseline":
            model_dir = out_dir / "models" / f"{family}-{method}-r{round(ratio * 100)}-{key}"
            if not (model_dir / "selection.json").is_file():
                prune(PruneConfig(model=str(ckpt), method=method, ratio=ratio, out=str(model_dir),
                                  calib=settings.calib, n_calib=settings.n_calib, seq_len=settings.calib_seq_len,
                                  seed=settings.seed, overwrite=True, data_dir=data_dir))
            prune_record = json.loads((model_dir / "selection.json").read_text())
        metrics, data = _perplexities(model_dir, settings, data_dir=data_dir)
        write_json_atomic(out, {
            "kind": "evaluate", "profile": profile, "experiment": "table20", "cell_key": key,
            "config": {"family": family, "method": method, "ratio": ratio, "rft": False,
                       "select": "kq", **settings.__dict__, "split": "test",
                       "metric": "token-level perplexity, non-overlapping windows"},
            "metrics": metrics,
            "model": {"path": str(model_dir.relative_to(REPO_ROOT) if model_dir.is_relative_to(REPO_ROOT) else model_dir),
                      "weights_sha256": weights_sha256(model_dir), "dense_weights_sha256": cell["dense_weights_sha256"]},
            "prune": None if prune_record is None else {
                k: prune_record[k] for k in ("key_dim_before", "key_dim_after", "state_bytes_per_sequence",
                                             "calibration", "wall_time_s")},
            "data": data, "wall_time_s": round(time.time() - t0, 2), "provenance": collect_provenance(),
        })
        written.append(out)
    return written
