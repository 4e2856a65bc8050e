"""CPU training of the S5 ListOps classifier: resumable, one training record per checkpoint.

A run keeps its state (model, optimiser, step, log) in `run_dir/state.pt`, written atomically every
`checkpoint_every` steps; the batch of step `s` is a pure function of (seed, s) (training.pretrain.batch_indices),
so a killed run resumes and sees exactly the data an uninterrupted one would. The finished model goes to
`out_dir` as model.safetensors + config.json + training_record.json (data manifest, wall time, losses,
validation and test accuracy next to the majority-class accuracy, provenance).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import yaml
from safetensors.torch import load_file, save_file

from state_reduction.atomic import publish_folder, save_torch_atomic, write_json_atomic
from state_reduction.checkpoints import load_run_state
from state_reduction.hashing import config_key
from state_reduction.provenance import collect_provenance
from state_reduction.ssm.listops import N_CLASSES, VOCAB_SIZE, ListOpsSpec, generate, verify
from state_reduction.ssm.s5 import S5Classifier, S5Config
from state_reduction.training.pretrain import batch_indices


@dataclass
class TrainConfig:
    seed: int = 0
    data: dict = field(default_factory=dict)      # ListOpsSpec fields
    model: dict = field(default_factory=dict)     # S5Config fields but vocab/classes
    steps: int = 1500
    batch_size: int = 32
    lr: float = 3e-3
    ssm_lr: float = 1e-3                          # lambda and dt, without weight decay (as S5)
    weight_decay: float = 0.05
    warmup_steps: int = 100
    min_lr_ratio: float = 0.05
    grad_clip: float = 1.0
    checkpoint_every: int = 100
    eval_every: int = 250

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides) -> TrainConfig:
        raw = yaml.safe_load(Path(path).read_text())["train"]
        raw.update({k: v for k, v in overrides.items() if v is not None})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"{path}: unknown train keys {unknown}; known: {sorted(known)}")
        return cls(**raw)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def hash(self) -> str:
        return config_key(self.to_dict())

    def spec(self) -> ListOpsSpec:
        return ListOpsSpec(**self.data)

    def s5_config(self) -> S5Config:
        return S5Config(vocab_size=VOCAB_SIZE, n_classes=N_CLASSES, **self.model)


def lr_factor(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def to_tensors(split: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[torch.Tensor, ...]:
    return tuple(torch.from_numpy(a) for a in split)


@torch.no_grad()
def accuracy(model: S5Classifier, tokens: torch.Tensor, lengths: torch.Tensor, labels: torch.Tensor,
             batch_size: int = 500) -> float:
    """Fraction of correct argmax predictions; batches cut to their longest sequence."""
    model.eval()
    correct = 0
    for i in range(0, len(labels), batch_size):
        ln = lengths[i:i + batch_size]
        logits = model(tokens[i:i + batch_size, :int(ln.max())], ln)
        correct += int((logits.argmax(-1) == labels[i:i + batch_size]).sum())
    return correct / len(labels)


def _optimizer(model: S5Classifier, cfg: TrainConfig) -> torch.optim.Optimizer:
    ssm_names = ("log_neg_real", "imag", "log_dt")
    ssm = [p for n, p in model.named_parameters() if n.rsplit(".", 1)[-1] in ssm_names]
    no_decay = [p for n, p in model.named_parameters()
                if n.rsplit(".", 1)[-1] not in ssm_names and (p.ndim < 2 or "norm" in n or n.endswith(".D"))]
    seen = {id(p) for p in ssm + no_decay}
    decay = [p for p in model.parameters() if id(p) not in seen]
    return torch.optim.AdamW([{"params": decay, "lr": cfg.lr, "weight_decay": cfg.weight_decay},
                              {"params": no_decay, "lr": cfg.lr, "weight_decay": 0.0},
                              {"params": ssm, "lr": cfg.ssm_lr, "weight_decay": 0.0}], betas=(0.9, 0.98))


def save_s5(model: S5Classifier, record: dict, out_dir: str | Path) -> None:
    """model.safetensors + config.json + training_record.json, replacing `out_dir` atomically (atomic.publish_folder)."""
    def fill(tmp: Path) -> None:
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, tmp / "model.safetensors")
        write_json_atomic(tmp / "config.json", model.cfg.to_dict())
        write_json_atomic(tmp / "training_record.json", record)

    publish_folder(out_dir, fill, overwrite=True)


def load_s5(model_dir: str | Path) -> S5Classifier:
    model_dir = Path(model_dir)
    if not (model_dir / "model.safetensors").is_file():
        raise FileNotFoundError(f"load_s5: no model.safetensors in {model_dir} (train it: make aire-home)")
    model = S5Classifier(S5Config(**json.loads((model_dir / "config.json").read_text())))
    model.load_state_dict(load_file(model_dir / "model.safetensors"))
    return model.eval()


def train(cfg: TrainConfig, out_dir: str | Path, run_dir: str | Path, log=print) -> dict:
    """Train (or resume) and save the checkpoint; returns the training record."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    data, manifest = generate(cfg.spec())
    train_t, val_t, test_t = (to_tensors(data[s]) for s in ("train", "val", "test"))
    torch.manual_seed(cfg.seed)
    model = S5Classifier(cfg.s5_config())
    opt = _optimizer(model, cfg)
    state_path = run_dir / "state.pt"
    step, history, elapsed = 0, [], 0.0
    if state_path.exists():
        state = load_run_state(state_path, cfg.hash(), ("model", "optimizer", "rng", "step", "history", "elapsed_s"),
                               "S5 training run", hint=f"delete {run_dir} to start over")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        step, history, elapsed = state["step"], state["history"], state["elapsed_s"]
        log(f"resumed at step {step}")
    tokens, lengths, labels = train_t
    t0 = time.perf_counter() - elapsed
    model.train()
    while step < cfg.steps:
        idx = batch_indices(step, len(labels), cfg.batch_size, cfg.seed)
        ln = lengths[idx]
        for g, base in zip(opt.param_groups, (cfg.lr, cfg.lr, cfg.ssm_lr)):
            g["lr"] = base * lr_factor(step, cfg)
        loss = torch.nn.functional.cross_entropy(model(tokens[idx, :int(ln.max())], ln), labels[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        entry = {"step": step, "loss": loss.item()}
        if step % cfg.eval_every == 0 or step == cfg.steps:
            entry["val_acc"] = accuracy(model, *val_t)
            model.train()
            log(f"step {step} loss {loss.item():.4f} val_acc {entry['val_acc']:.4f} ({time.perf_counter() - t0:.0f} s)")
        history.append(entry)
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            save_torch_atomic(state_path, {"config_hash": cfg.hash(), "model": model.state_dict(),
                                           "optimizer": opt.state_dict(), "rng": torch.get_rng_state(), "step": step,
                                           "history": history, "elapsed_s": time.perf_counter() - t0})
    wall = time.perf_counter() - t0
    verify(data, manifest)
    majority = float(np.bincount(data["test"][2], minlength=N_CLASSES).max() / len(data["test"][2]))
    record = {
        "name": Path(out_dir).name, "config": cfg.to_dict(), "config_hash": cfg.hash(),
        "n_parameters": sum(p.numel() for p in model.parameters()), "data_manifest": manifest,
        "wall_time_s": round(wall, 1), "threads": torch.get_num_threads(),
        "final_train_loss": float(np.mean([h["loss"] for h in history[-50:]])),
        "val_accuracy": accuracy(model, *val_t), "test_accuracy": accuracy(model, *test_t),
        "test_majority_class_accuracy": majority,
        "curve": [h for h in history if "val_acc" in h], "provenance": collect_provenance(),
    }
    save_s5(model, record, out_dir)
    return record
