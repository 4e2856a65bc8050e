"""One-seed 50% pre-RFT comparison of the selectors on the tiny DeltaNet and Gated DeltaNet (prune defaults:
ptb calibration, 32 windows of 256 tokens, seed 0), `tiny_ppl` with a per-task limit; writes OUT (JSON).

    python scripts/compare_selectors_tiny.py 20 /tmp/compare.json
"""

import json
import sys
import tempfile
import time
from pathlib import Path

import torch

import state_reduction  # noqa: F401
from state_reduction.backend import install_cpu_backend
from state_reduction.checkpoints import load_model, load_tokenizer
from state_reduction.errors import Error
from state_reduction.evaluation.run import evaluate
from state_reduction.pruning.prune import PruneConfig, prune

CHECKPOINTS = Path(__file__).resolve().parents[1] / "experiments" / "tiny_models" / "checkpoints"
METHODS = ["l1", "wanda", "grad", "drrqr", "energy", "think", "ghost", "taylor"]


def perplexities(path, limit: int) -> dict:
    model = load_model(str(path), dtype=torch.float32).eval()
    return evaluate(model, load_tokenizer(str(path)), suite="tiny_ppl", batch_size=8, max_length=256,
                    limit=limit)["metrics"]


def main(limit: int, out: str) -> None:
    torch.set_num_threads(1)
    install_cpu_backend()
    rows = {}
    for family in ["deltanet", "gated_deltanet"]:
        rows[f"{family}/dense"] = perplexities(CHECKPOINTS / family, limit)
        for method in METHODS:
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.time()
                try:
                    prune(PruneConfig(model=str(CHECKPOINTS / family), method=method, ratio=0.5,
                                      out=f"{tmp}/o", seed=0, device="cpu"))
                except Error as e:
                    print(family, method, "refused:", e, flush=True)
                    continue
                rows[f"{family}/{method}"] = {**perplexities(f"{tmp}/o", limit), "prune_s": time.time() - t0}
            print(family, method, rows[f"{family}/{method}"], flush=True)
    Path(out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
