"""Save (or compare against) every selector's selection on the committed tiny checkpoints, end to end through
`prune` (real calibration data, the calibration each selector triggers) and through `calibrate` + `select` on
random windows for every coupled mode. Used to show a refactor of the selectors keeps selections bit-identical:

    python scripts/selection_snapshot.py save  /tmp/before.pt   # on the old code
    python scripts/selection_snapshot.py check /tmp/before.pt   # on the new code: exits 1 on any difference
"""

import sys
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

import state_reduction  # noqa: F401
from state_reduction.models.families import get_adapter
from state_reduction.pruning.calibration import calibrate
from state_reduction.pruning.prune import PruneConfig, prune
from state_reduction.pruning.selectors import MODES, select

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINTS = ROOT / "experiments" / "tiny_models" / "checkpoints"
FAMILIES = ["deltanet", "gated_deltanet", "mamba2", "qwen3_5"]
METHODS = ["rand", "l1", "wanda", "grad", "drrqr", "pca", "pca-adv", "energy"]


def _as_tensors(sel) -> dict:
    return {"keep": sel.keep, "rotation": sel.rotation}


def snapshot() -> dict:
    out = {}
    torch.set_num_threads(1)
    for family in FAMILIES:
        path = CHECKPOINTS / family
        for method in METHODS:
            for stream in (False, True):
                if stream and method not in ("grad", "drrqr", "wanda"):
                    continue
                with tempfile.TemporaryDirectory() as tmp:
                    rec = prune(PruneConfig(model=str(path), method=method, ratio=0.5, out=str(Path(tmp) / "m"),
                                            n_calib=4, seq_len=64, batch_size=2, stream_layers=stream, device="cpu"))
                    rot = Path(tmp) / "m" / "selection_rotations.safetensors"
                    rots = None
                    if rot.exists():
                        from safetensors.torch import load_file
                        rots = load_file(str(rot))
                out[("prune", family, method, stream)] = (rec["selection"], rots)
        model = AutoModelForCausalLM.from_pretrained(str(path))
        adapter = get_adapter(model)
        windows = torch.randint(0, model.config.vocab_size, (5, 32), generator=torch.Generator().manual_seed(0))
        stats = calibrate(model, adapter, windows, batch_size=2, gradients=True)
        _, K = adapter.key_heads(model.config)
        for ref in adapter.mixers(model):
            w_q, w_k = (w.detach() for w in adapter.qk_weights(ref.module))
            for method in METHODS:
                for mode in MODES:
                    for keep in (K // 4, K // 2, K - 1):
                        sel = select(method, stats[ref.layer], w_q, w_k, keep, mode,
                                     torch.Generator().manual_seed(0), ref.layer)
                        out[("select", family, ref.layer, method, mode, keep)] = _as_tensors(sel)
        print(family, "done", flush=True)
    return out


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


if __name__ == "__main__":
    action, file = sys.argv[1], sys.argv[2]
    now = snapshot()
    if action == "save":
        torch.save(now, file)
        print(f"saved {len(now)} selections to {file}")
    else:
        before = torch.load(file, weights_only=False)
        bad = [key for key in before if key not in now or not _equal(before[key], now[key])]
        print(f"{len(before)} selections compared, {len(bad)} differ")
        for key in bad[:20]:
            print("DIFFERS:", key)
        sys.exit(1 if bad else 0)
