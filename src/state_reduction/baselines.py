"""Dense-model rows of Table 20 on the tiny profile: held-out token perplexity of each committed
checkpoint, one result JSON per model, skipped when an up-to-date result exists."""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from state_reduction.provenance import REPO_ROOT, collect_provenance, write_json_atomic

TINY_CHECKPOINTS = REPO_ROOT / "experiments" / "tiny_models" / "checkpoints"
TINY_FAMILIES = ("deltanet", "gated_deltanet", "mamba2", "qwen3_5")
PPL_CORPORA = {"wiki": "wiki", "ptb": "ptb"}  # column -> tiny corpus (wiki: the WikiText stand-in)


def weights_sha256(checkpoint: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(checkpoint.glob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()


def evaluate_dense_baselines(profile: str, out_dir: Path, seq_len: int = 256, batch_size: int = 16,
                             data_dir=None) -> list[Path]:
    if profile != "tiny":
        raise NotImplementedError(
            f"profile {profile!r}: Table 20 on the paper profile needs the pruning, lm-eval and RFT pipeline "
            "(not built yet); run `make table20` (PROFILE=tiny) for the dense tiny baselines")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import state_reduction  # noqa: F401
    from state_reduction.backend import install_cpu_backend
    from state_reduction.data import get_corpus_info
    from state_reduction.data.sampler import stream_tokens
    from state_reduction.training.pretrain import window_nll

    install_cpu_backend()
    written = []
    for family in tqdm(TINY_FAMILIES, desc="table20 baselines"):
        ckpt = TINY_CHECKPOINTS / family
        if not (ckpt / "config.json").is_file():
            raise FileNotFoundError(f"tiny checkpoint {ckpt} is missing; run `make tiny-models`")
        out = out_dir / f"baseline-{family}.json"
        digest = weights_sha256(ckpt)
        if out.exists() and json.loads(out.read_text()).get("model", {}).get("weights_sha256") == digest:
            written.append(out)
            continue
        t0 = time.time()
        tok = AutoTokenizer.from_pretrained(str(ckpt))
        model = AutoModelForCausalLM.from_pretrained(str(ckpt))
        metrics, data = {}, {}
        for column, corpus in PPL_CORPORA.items():
            tokens = torch.from_numpy(stream_tokens(tok, corpus, "evaluation", split="test", data_dir=data_dir))
            nll = window_nll(model, tokens, seq_len, batch_size, desc=f"{family} {corpus}")
            metrics[f"{column}_ppl"] = math.exp(nll.double().mean().item())
            metrics[f"{column}_tokens"] = int(nll.numel())
            data[corpus] = get_corpus_info(corpus).sha256
        write_json_atomic(out, {
            "kind": "evaluate", "profile": profile, "experiment": "table20",
            "config": {"family": family, "method": "baseline", "ratio": 0.0, "rft": False, "seq_len": seq_len,
                       "split": "test", "metric": "token-level perplexity, non-overlapping windows"},
            "metrics": metrics,
            "model": {"path": str(ckpt.relative_to(REPO_ROOT)), "weights_sha256": digest},
            "data": data, "wall_time_s": round(time.time() - t0, 2), "provenance": collect_provenance(),
        })
        written.append(out)
    return written
