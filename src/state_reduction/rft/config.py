"""RFT configuration: a typed dataclass with the paper's recipe as defaults, named presets, YAML and
`key=value` overrides (lingua-style), and the identity hash a resumed run must match."""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from state_reduction.errors import Error
from state_reduction.hashing import config_key


class RFTError(Error, ValueError):
    """Bad RFT input or a run that cannot continue; the message names the model, module, key or step."""


# Fields that do not change what a run computes: a checkpoint resumes across them.
NON_IDENTITY = ("out", "resume", "overwrite", "threads", "progress", "wandb", "wandb_project", "log_every",
                "save_every", "device", "micro_batch_size", "distributed", "eval_corpora", "eval_seq_len",
                "experiment")
# Fields added after results were keyed, at the value that reproduces the earlier computation: left out of the
# identity (and so of every RFT key) at that value, so earlier runs and results stay valid.
ADDED_FIELDS = {"ce_weight": 1.0}


@dataclass
class RFTConfig:
    """Recovery fine-tuning of a pruned `student` with LoRA and distillation from the dense `teacher`.

    Defaults are the paper's recipe (REFERENCE.md section 2): LoRA r 32, alpha 64, dropout 0 on the q/k/v
    projections, conv/norm/bias parameters trainable, loss CE + T^2 KL with T = 2, AdamW lr 1e-4, wd 0.1,
    eps 1e-15, cosine to 0.1x after a short warm-up, grad clip 1.0, 2000 steps of 16 x 2048 tokens."""

    student: str
    teacher: str | None
    out: str
    profile: str = "paper"
    experiment: str = "rft"
    corpora: list[str] = field(default_factory=lambda: ["fineweb-edu"])
    steps: int = 2000
    batch_size: int = 16  # global, over all processes
    # per process and forward; None: the whole local batch. 2 x 2048 tokens keeps the full-vocab logits, their
    # fp32 copies and gradients at ~4 GiB where 16 x 2048 in one forward would need ~31 GiB (issue 22)
    micro_batch_size: int | None = 2
    seq_len: int = 2048
    lr: float = 1e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.1
    adam_betas: tuple[float, float] = (0.9, 0.95)
    adam_eps: float = 1e-15
    grad_clip: float = 1.0
    rank: int = 32
    alpha: float = 64.0
    dropout: float = 0.0
    lora_targets: list[str] | None = None  # None: the family's q/k/v projections (rft.targets)
    train_extra: list[str] = field(default_factory=lambda: ["conv1d", "norm", "bias"])
    kd_temperature: float = 2.0
    kd_weight: float = 1.0
    # weight of the cross-entropy on the data; 0: distillation only (the student fits the teacher, not the corpus)
    ce_weight: float = 1.0
    seed: int = 0
    save_every: int = 200
    resume: bool = False
    overwrite: bool = False
    device: str = "auto"  # auto: cuda when available (the local rank's GPU), else cpu
    distributed: str = "auto"  # auto: ddp when WORLD_SIZE > 1; none, ddp, fsdp
    threads: int = 0
    progress: bool | None = None  # None: a bar on a TTY, rare updates (mininterval 30 s) otherwise
    wandb: str | None = None  # offline, online or disabled; None: $WANDB_MODE, else offline
    wandb_project: str = "state-reduction"
    log_every: int = 1
    eval_corpora: list[str] = field(default_factory=list)  # held-out ppl (test split) before and after
    eval_seq_len: int = 256

    def __post_init__(self):
        self.adam_betas = tuple(self.adam_betas)
        if isinstance(self.corpora, str):
            self.corpora = [c for c in self.corpora.split(",") if c]
        if isinstance(self.eval_corpora, str):
            self.eval_corpora = [c for c in self.eval_corpora.split(",") if c]
        if isinstance(self.lora_targets, str):
            self.lora_targets = [t for t in self.lora_targets.split(",") if t]

    def validate(self) -> None:
        if self.profile not in ("tiny", "paper"):
            raise RFTError(f"profile must be tiny or paper, got {self.profile!r}")
        for name in ("steps", "batch_size", "seq_len", "rank", "save_every", "log_every"):
            if getattr(self, name) < 1:
                raise RFTError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.seq_len < 2:
            raise RFTError(f"seq_len must be >= 2, got {self.seq_len}")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise RFTError(f"micro_batch_size must be >= 1, got {self.micro_batch_size}")
        if not 0 <= self.min_lr_ratio <= 1 or self.lr <= 0 or self.warmup_steps < 0:
            raise RFTError(f"need lr > 0, warmup_steps >= 0, 0 <= min_lr_ratio <= 1; got {self.lr}, "
                           f"{self.warmup_steps}, {self.min_lr_ratio}")
        if self.kd_temperature <= 0:
            raise RFTError(f"kd_temperature must be positive, got {self.kd_temperature}")
        if self.kd_weight < 0 or self.ce_weight < 0:
            raise RFTError(f"kd_weight and ce_weight must be >= 0, got {self.kd_weight} and {self.ce_weight}")
        if self.ce_weight == 0 and (self.teacher is None or self.kd_weight == 0):
            raise RFTError("ce_weight 0 (distillation only) needs a teacher and kd_weight > 0: the loss would be "
                           f"zero (teacher {self.teacher!r}, kd_weight {self.kd_weight})")
        if self.distributed not in ("auto", "none", "ddp", "fsdp"):
            raise RFTError(f"distributed must be auto, none, ddp or fsdp, got {self.distributed!r}")
        if self.wandb not in (None, "offline", "online", "disabled"):
            raise RFTError(f"wandb must be offline, online or disabled, got {self.wandb!r}")
        if not self.corpora:
            raise RFTError("corpora is empty: name at least one corpus (its `finetune` stream is used)")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["adam_betas"] = list(self.adam_betas)
        return d

    def identity(self) -> dict:
        """The fields that determine the computation (what a resumed run must share)."""
        return {k: v for k, v in self.to_dict().items()
                if k not in NON_IDENTITY and not (k in ADDED_FIELDS and v == ADDED_FIELDS[k])}

    def recipe(self) -> dict:
        """The identity fields without the models: every value that decides what RFT computes (the pipeline's
        RFT key holds these, so editing a default or a preset reruns RFT and what follows)."""
        return {k: v for k, v in self.identity().items() if k not in ("student", "teacher")}

    def hash(self) -> str:
        return config_key(self.identity())

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "RFT config") -> RFTConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            hints = [f"{u} (did you mean {m[0]}?)" if (m := difflib.get_close_matches(u, known, n=1)) else u
                     for u in unknown]
            raise RFTError(f"{where}: unknown keys {', '.join(hints)}")
        return cls(**raw)

    @classmethod
    def from_preset(cls, preset: str, student: str, teacher: str | None, out: str, **overrides) -> RFTConfig:
        if preset not in PRESETS:
            close = difflib.get_close_matches(preset, list(PRESETS), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise RFTError(f"unknown RFT preset {preset!r}{hint} (presets: {', '.join(PRESETS)})")
        raw = {**PRESETS[preset], **{k: v for k, v in overrides.items() if v is not None}}
        return cls.from_dict({"student": student, "teacher": teacher, "out": out, **raw}, where=f"preset {preset}")

    @classmethod
    def tiny_preset(cls, student: str, teacher: str | None, out: str, **overrides) -> RFTConfig:
        return cls.from_preset("tiny", student, teacher, out, **overrides)

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides) -> RFTConfig:
        raw = yaml.safe_load(Path(path).read_text()) or {}
        preset = raw.pop("preset", "paper")
        raw.update({k: v for k, v in overrides.items() if v is not None})
        student, teacher, out = raw.pop("student", None), raw.pop("teacher", None), raw.pop("out", None)
        if student is None or out is None:
            raise RFTError(f"{path}: needs `student` and `out` (or pass them on the command line)")
        return cls.from_preset(preset, student, teacher, out, **raw)


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """`key=value` strings -> dict, values parsed as YAML scalars/lists (lr=1e-3, corpora=[ptb,wiki])."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise RFTError(f"override {pair!r} is not key=value")
        out[key.replace("-", "_")] = yaml.safe_load(value)
    return out


# Named settings over the dataclass defaults. `paper` is the recipe; `tiny` fits a CPU budget of
# ~15-25 s per tiny model (2 cores) and still lowers held-out perplexity (experiments/rft/README.md).
PRESETS: dict[str, dict[str, Any]] = {
    "paper": {},
    "tiny": {
        "profile": "tiny", "corpora": ["ptb", "wiki"], "steps": 32, "batch_size": 8, "seq_len": 128,
        "lr": 1e-3, "warmup_steps": 3, "save_every": 16, "threads": 1, "micro_batch_size": None,
        "resume": True,  # a rerun (make) continues a killed run or returns the finished record
    },
}
# The budget the RFT budget sweep chose for both tiny families by its rule (experiments/rft/README.md): distillation
# only (the dense model's books ppl moves < 0.3%, so it is a recovery step, not continued pretraining), 96 steps, lr
# 1e-3; the rest as `tiny`. Every tiny table with post-RFT cells uses it (joint_compression at its own 16 steps;
# selector_benchmark's grid since 2026-12-07, `tiny` before); `tiny` remains the RFT budget sweep's starting recipe
# (experiments/rft) and the setting of experiments with no post-RFT table.
PRESETS["tiny-recovery"] = {**PRESETS["tiny"], "steps": 96, "ce_weight": 0.0, "save_every": 32}


def config_diff(saved: dict, current: dict) -> list[str]:
    """Lines `key: saved -> current` for every identity key that differs."""
    keys = sorted(set(saved) | set(current))
    return [f"{k}: {saved.get(k, '<absent>')!r} -> {current.get(k, '<absent>')!r}"
            for k in keys if saved.get(k) != current.get(k)]
