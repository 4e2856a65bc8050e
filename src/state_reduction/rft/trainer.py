"""Recovery fine-tuning (RFT): LoRA on a pruned student, distilled from its dense teacher.

One loop serves one process, DDP and FSDP (torchrun sets WORLD_SIZE). The global batch of step `s` is a
pure function of (seed, s) over the `finetune` stream's windows, and each process takes its slice, so the
data position is the step and a resumed or re-sharded run sees exactly the batches an uninterrupted one
would. A checkpoint holds the trainable parameters, optimizer, scheduler, every process's RNG, the step and
the metrics so far; it is written atomically every `save_every` steps and never after a non-finite loss.
The final model is the student with LoRA merged, saved with save_pretrained (reduced key dim kept).
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP
from transformers import AutoTokenizer
from tqdm.auto import tqdm

from state_reduction.atomic import (
    check_output,
    remove_stale,
    save_torch_atomic,
    write_json_atomic,
    write_text_atomic,
)
from state_reduction.atomic import is_complete
from state_reduction.backend import install_cpu_backend
from state_reduction.checkpoints import load_config, load_model, load_tokenizer, save_model_atomic
from state_reduction.data import get_corpus_info
from state_reduction.data.sampler import stream_tokens, tokenizer_fingerprint
from state_reduction.devices import checkpoint_dtype, compute_dtype
from state_reduction.models.families import get_adapter
from state_reduction.models.shed import SHED_SUFFIX
from state_reduction.results import build_result, model_entry, read_result, write_result
from state_reduction.rft.config import RFTConfig, RFTError, config_diff
from state_reduction.rft.targets import extra_trainable, resolve_lora_targets
from state_reduction.training.pretrain import batch_indices, window_nll
from state_reduction.training.schedule import warmup_cosine

STATE_FILE = "checkpoints/state.pt"
RESULT_FILE = "rft_result.json"
MODEL_DIR = "model"
LOG_FILE = "log.jsonl"


# ---------------------------------------------------------------------------------------------- loss

def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor | None, input_ids: torch.Tensor,
                      temperature: float, kd_weight: float,
                      ce_weight: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ce_weight * CE + kd_weight * T^2 * KL(teacher_T || student_T), CE, KL), each a mean over next-token
    positions; ce_weight 0 is distillation only.

    logits [B, T, V], input_ids [B, T]; position t predicts token t + 1 (the last position is dropped)."""
    s = student_logits[:, :-1].float().flatten(0, 1)  # [B*(T-1), V]
    ce = F.cross_entropy(s, input_ids[:, 1:].flatten())
    if teacher_logits is None:
        return ce, ce, torch.zeros_like(ce)
    t = teacher_logits[:, :-1].float().flatten(0, 1)
    kl = F.kl_div(F.log_softmax(s / temperature, -1), F.log_softmax(t / temperature, -1), log_target=True,
                  reduction="batchmean")
    kd = kd_weight * temperature ** 2 * kl
    return (ce + kd if ce_weight == 1.0 else ce_weight * ce + kd), ce, kl


# ------------------------------------------------------------------------------------- distribution

class DistContext:
    """Rank, world size, device and the parallel wrapper; initialises the process group when torchrun
    (or a test) set WORLD_SIZE > 1 and none exists yet (gloo on CPU, nccl on CUDA)."""

    def __init__(self, cfg: RFTConfig):
        self.dist = dist
        world = int(os.environ.get("WORLD_SIZE", "1"))
        self.created = False
        if world > 1 and not dist.is_initialized():
            use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
            dist.init_process_group(backend="nccl" if use_cuda else "gloo")
            self.created = True
        self.enabled = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.enabled else 0
        self.world = dist.get_world_size() if self.enabled else 1
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if cfg.device == "auto":
            self.device = torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
        else:
            self.device = torch.device(cfg.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        mode = cfg.distributed
        if mode == "auto":
            mode = "ddp" if self.world > 1 else "none"
        if mode in ("ddp", "fsdp") and not self.enabled:
            raise RFTError(f"distributed={mode} needs a process group: launch with torchrun --nproc-per-node N")
        self.mode = mode

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.enabled:
            self.dist.barrier()

    def mean(self, values: list[float]) -> list[float]:
        if not self.enabled:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.device if self.device.type == "cuda" else "cpu")
        self.dist.all_reduce(t)
        return (t / self.world).tolist()

    def gather_object(self, obj):
        if not self.enabled:
            return [obj]
        out = [None] * self.world
        self.dist.all_gather_object(out, obj)
        return out

    def any_true(self, flag: bool) -> bool:
        if not self.enabled:
            return flag
        t = torch.tensor([1.0 if flag else 0.0], device=self.device if self.device.type == "cuda" else "cpu")
        self.dist.all_reduce(t)
        return bool(t.item() > 0)

    def close(self) -> None:
        if self.created and self.dist.is_initialized():
            self.dist.destroy_process_group()


# ------------------------------------------------------------------------------------------- models

def load_causal_lm(path: str, what: str, dtype: torch.dtype | str = torch.float32, vocabulary_in_storage: bool = True):
    """checkpoints.load_model (files, config and finite weights checked; a failure names the file) in `dtype`:
    float32 by default, so that a bf16 checkpoint's trainable parameters (LoRA, norms, biases, convs) keep fp32
    master weights (in bf16, updates of lr 1e-4 round away: issue 22). The frozen embedding and head stay in the
    checkpoint's dtype where `vocabulary_in_storage` (the CPU; DDP/FSDP want one dtype)."""
    return load_model(path, what, dtype=dtype, vocabulary_in_storage=vocabulary_in_storage)


def check_pair(student, teacher, student_path: str, teacher_path: str) -> None:
    """Teacher and student must be one family with one vocabulary (same logits space)."""
    s, t = student.config, teacher.config
    # a linearized variant (base_model_type) or a student with structures removed (models/shed.py) pairs with its
    # family's dense teacher
    def family(config) -> str:
        return getattr(config, "base_model_type", config.model_type).removesuffix(SHED_SUFFIX)

    if family(s) != family(t):
        raise RFTError(f"teacher {teacher_path} is {t.model_type!r} but student {student_path} is {s.model_type!r}; "
                       "the teacher must be the unpruned model of the student's family")
    if s.vocab_size != t.vocab_size:
        raise RFTError(f"teacher {teacher_path} has vocab_size {t.vocab_size}, student {student_path} has "
                       f"{s.vocab_size}; distillation needs one vocabulary")

    fps = []
    for path in (student_path, teacher_path):
        try:
            fps.append(tokenizer_fingerprint(AutoTokenizer.from_pretrained(path)))
        except (OSError, ValueError):
            fps.append(None)
    if None not in fps and fps[0] != fps[1]:
        raise RFTError(f"teacher {teacher_path} and student {student_path} have different tokenizers "
                       f"(fingerprints {fps[1]} != {fps[0]}); distillation needs one vocabulary")


def build_student(model: nn.Module, cfg: RFTConfig):
    """Wrap `model` with peft LoRA on the family's targets and mark conv/norm/bias params trainable.

    Returns the PeftModel; only LoRA and `train_extra` parameters require grad."""
    # lazy: start-up time (peft only when RFT builds its student)
    from peft import LoraConfig, get_peft_model

    targets = resolve_lora_targets(model, cfg.lora_targets)
    extra_names = set(extra_trainable(model, cfg.train_extra))
    extra = [p for n, p in model.named_parameters() if n in extra_names]
    lora = LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=targets, bias="none")
    try:
        peft_model = get_peft_model(model, lora)
    except (ValueError, TypeError, RuntimeError) as e:
        raise RFTError(f"{model.config.model_type}: peft cannot wrap the LoRA targets {targets}: {e}") from None
    for p in extra:
        p.requires_grad_(True)
    return peft_model


def trainable_state(peft_model: nn.Module) -> dict[str, torch.Tensor]:
    """name -> full (unsharded) CPU copy of every trainable parameter."""
    out = {}
    for name, p in peft_model.named_parameters():
        if p.requires_grad:
            t = p.full_tensor() if hasattr(p, "full_tensor") else p
            out[name] = t.detach().to("cpu", copy=True)
    return out


def load_trainable_state(peft_model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    params = dict(peft_model.named_parameters())
    missing = sorted(set(state) - set(params))
    if missing:
        raise RFTError(f"checkpoint has parameters the model lacks: {', '.join(missing[:5])}")
    with torch.no_grad():
        for name, value in state.items():
            params[name].copy_(value)


def merged_model(student_path: str, cfg: RFTConfig, state: dict[str, torch.Tensor]):
    """A fresh student with `state` loaded and LoRA merged (W + alpha/r * B A): a plain transformers model."""
    peft_model = build_student(load_causal_lm(student_path, "student"), cfg)
    load_trainable_state(peft_model, state)
    return peft_model.merge_and_unload()


def _decoder_layers(model: nn.Module) -> nn.ModuleList:
    lists = [m for n, m in model.named_modules() if isinstance(m, nn.ModuleList) and n.endswith("layers")]
    if not lists:
        raise RFTError(f"FSDP: {type(model).__name__} has no `layers` ModuleList to shard")
    return lists[0]


def shard_fsdp(model: nn.Module, ctx: DistContext) -> nn.Module:
    """FSDP2: shard each decoder layer, then the root (embeddings, head)."""
    mesh = init_device_mesh(ctx.device.type, (ctx.world,))
    for layer in _decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


# --------------------------------------------------------------------------------------------- data

def finetune_windows(tokenizer, cfg: RFTConfig) -> tuple[torch.Tensor, dict]:
    """Non-overlapping windows [N, seq_len] of the `finetune` streams of cfg.corpora, and their sha256s."""
    parts, data = [], {}
    need = cfg.steps * cfg.batch_size * cfg.seq_len
    for corpus in cfg.corpora:
        info = get_corpus_info(corpus)
        budget = -(-need // len(cfg.corpora)) if info.streaming else None
        tokens = torch.from_numpy(np.asarray(stream_tokens(tokenizer, corpus, "finetune", budget=budget,
                                                           seed=cfg.seed))).long()
        n = tokens.numel() // cfg.seq_len
        parts.append(tokens[: n * cfg.seq_len].view(n, cfg.seq_len))
        data[corpus] = info.sha256
    windows = torch.cat(parts)
    if windows.shape[0] < cfg.batch_size:
        raise RFTError(f"the finetune streams of {', '.join(cfg.corpora)} hold {windows.shape[0]} windows of "
                       f"{cfg.seq_len} tokens, fewer than batch_size={cfg.batch_size}")
    return windows, data


def heldout_ppl(model, tokenizer, corpora: list[str], seq_len: int) -> dict[str, float]:
    out = {}
    for corpus in corpora:
        tokens = torch.from_numpy(np.asarray(stream_tokens(tokenizer, corpus, "evaluation", split="test"))).long()
        nll = window_nll(model, tokens, seq_len, 16, desc=f"ppl {corpus}")
        out[corpus] = math.exp(nll.double().mean().item())
    model.train()
    return out


# ------------------------------------------------------------------------------------- checkpoints

def _rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def _set_rng_state(s: dict) -> None:
    torch.set_rng_state(s["torch"])
    np.random.set_state(s["numpy"])
    random.setstate(s["python"])
    if s.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


STATE_KEYS = ("config_hash", "config", "step", "trainable", "optimizer", "scheduler", "rng", "history", "wall_s")


def load_state(path: Path) -> dict:
    """A checkpoint written by `save`; an empty, truncated or foreign file is a one-line error with the fix."""
    hint = "pass --overwrite to start over (the checkpoint cannot be resumed)"
    try:
        state = torch.load(path, weights_only=False, map_location="cpu")
    except Exception as e:  # torch.load raises many types for damaged files (EOFError, RuntimeError, UnpicklingError)
        raise RFTError(f"RFT checkpoint {path} is damaged: {type(e).__name__}: {' '.join(str(e).split())[:200]}",
                       hint=hint) from None
    missing = [k for k in STATE_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise RFTError(f"RFT checkpoint {path} is not one this code wrote (lacks {', '.join(missing)})", hint=hint)
    return state


def _optimizer_state(model, optimizer, ctx: DistContext):
    if ctx.mode == "fsdp":
        # lazy: start-up time (torch.distributed.checkpoint only for FSDP runs)
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return optimizer.state_dict()


def _load_optimizer_state(model, optimizer, state, ctx: DistContext) -> None:
    if ctx.mode == "fsdp":
        # lazy: start-up time (torch.distributed.checkpoint only for FSDP runs)
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))
    else:
        optimizer.load_state_dict(state)


# ------------------------------------------------------------------------------------------ logging

class _Logger:
    """tqdm (rare updates off a TTY), log.jsonl and wandb, on the main process only."""

    def __init__(self, cfg: RFTConfig, out: Path, ctx: DistContext, start: int):
        self.cfg, self.ctx, self.out = cfg, ctx, out
        self.bar, self.wandb_run = None, None
        if not ctx.main:
            return
        tty = sys.stderr.isatty()
        enabled = cfg.progress if cfg.progress is not None else True
        self.bar = tqdm(total=cfg.steps, initial=start, desc=f"rft {Path(cfg.student).name}", disable=not enabled,
                        mininterval=0.5 if tty else 30.0, dynamic_ncols=tty, file=sys.stderr)
        mode = cfg.wandb or os.environ.get("WANDB_MODE") or "offline"
        if mode != "disabled":
            # lazy: start-up time (wandb only for a logged run)
            import wandb

            self.wandb_run = wandb.init(project=cfg.wandb_project, mode=mode, config=cfg.to_dict(),
                                        name=f"rft-{Path(cfg.student).name}-{cfg.hash()}",
                                        dir=os.environ.get("WANDB_DIR") or str(out), reinit="create_new")

    def step(self, rec: dict) -> None:
        if not self.ctx.main:
            return
        self.bar.set_postfix(loss=f"{rec['loss']:.3f}", tok_s=f"{rec['tokens_per_s']:.0f}", refresh=False)
        self.bar.update(1)
        with open(self.out / LOG_FILE, "a") as f:
            f.write(json.dumps(rec) + "\n")
        if self.wandb_run is not None and rec["step"] % self.cfg.log_every == 0:
            self.wandb_run.log({f"rft/{k}": v for k, v in rec.items() if k != "step"}, step=rec["step"])

    def summary(self, metrics: dict) -> None:
        if self.wandb_run is not None:
            self.wandb_run.summary.update({k: v for k, v in metrics.items() if v is not None})

    @property
    def wandb_dir(self) -> str | None:
        return getattr(self.wandb_run, "dir", None) if self.wandb_run is not None else None

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()


# --------------------------------------------------------------------------------------------- run

def _prepare_out(cfg: RFTConfig, out: Path, ctx: DistContext) -> dict | None:
    """Refuse to clobber a run. overwrite: start over. resume: return the finished result of the same
    config if there is one (else the checkpoint, if any, is continued)."""
    state_path = out / STATE_FILE
    result_path = out / RESULT_FILE
    if cfg.overwrite:  # start over; the finished model and result stay until the new ones replace them
        if ctx.main:
            for name in (STATE_FILE, LOG_FILE):
                (out / name).unlink(missing_ok=True)
        ctx.barrier()
        return None
    if cfg.resume and result_path.exists() and is_complete(out / MODEL_DIR):  # done = marker and result
        record = read_result(result_path)
        if record.get("extra", {}).get("config_hash") == cfg.hash():
            return record
    if state_path.exists() and not cfg.resume:
        raise RFTError(f"{out} holds an RFT checkpoint; pass resume (--resume) to continue it or overwrite "
                       "(--overwrite) to start over")
    return None


def run_rft(cfg: RFTConfig, *, stop_after: int | None = None) -> dict:
    """Fine-tune `cfg.student` and save `<out>/model` (LoRA merged) and `<out>/rft_result.json`.

    Returns the result record (results.build_result, kind "rft"). `stop_after` ends the call after that many
    optimizer steps without saving, as a kill would (tests); it then returns {"stopped_at": step}."""
    cfg.validate()
    ctx = DistContext(cfg)
    try:
        return _run(cfg, ctx, stop_after)
    finally:
        ctx.close()


def lr_factor(step: int, cfg: RFTConfig) -> float:
    """The learning-rate multiplier of `step`: linear warm-up, then cosine to `min_lr_ratio` (training.schedule)."""
    return warmup_cosine(step, cfg.steps, cfg.warmup_steps, cfg.min_lr_ratio)


@dataclass
class _Run:
    """What the steps of one RFT run share: set up by _setup, restored or started by _resume, advanced by _loop and
    saved by _save_merge."""

    out: Path
    t_start: float
    local_batch: int
    micro: int
    tokenizer: Any
    saved_dtype: torch.dtype
    windows: torch.Tensor  # [N, seq_len], the finetune stream's windows
    data: dict
    student: nn.Module  # the pruned model as loaded (its config names the family)
    teacher: nn.Module | None
    key_heads: list
    lora_targets: list[str]
    model: nn.Module  # the student with LoRA (peft), trained
    n_trainable: int
    n_lora: int
    state_path: Path
    wrapped: nn.Module | None = None  # `model` as the forward sees it (DDP) or `model` itself
    named: list = field(default_factory=list)  # sorted (name, parameter) pairs of the trainable parameters
    optimizer: torch.optim.Optimizer | None = None
    scheduler: Any = None
    step: int = 0
    wall_before: float = 0.0  # the training loops of earlier attempts
    history: list[dict] = field(default_factory=list)
    ppl_before: dict = field(default_factory=dict)
    eval_s: float = 0.0
    last_saved: int | None = None
    train_s: float = 0.0


def _run(cfg: RFTConfig, ctx: DistContext, stop_after: int | None) -> dict:
    run = _setup(cfg, ctx)
    if isinstance(run, dict):  # the finished result of the same config
        return run
    _resume(cfg, ctx, run)
    logger = _Logger(cfg, run.out, ctx, run.step)
    try:
        stopped = _loop(cfg, ctx, run, logger, stop_after)
        if stopped is not None:
            return stopped
        return _save_merge(cfg, ctx, run, logger)
    finally:
        logger.close()


def _setup(cfg: RFTConfig, ctx: DistContext) -> _Run | dict:
    """The run folder, batch split, tokenizer, fine-tuning windows, student (with LoRA) and teacher; or the
    finished record when the same config has already run to the end (resume)."""
    t_start = time.time()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = check_output(cfg.out, directory=True, overwrite=True)  # a run folder, resumed or started over below
    out.mkdir(parents=True, exist_ok=True)
    if ctx.main:  # what a killed attempt left half-written
        remove_stale(out)
        remove_stale(out / Path(STATE_FILE).parent)
    done = _prepare_out(cfg, out, ctx)
    if done is not None:
        return done
    if cfg.batch_size % ctx.world:
        raise RFTError(f"batch_size {cfg.batch_size} is not divisible by the {ctx.world} processes")
    local_batch = cfg.batch_size // ctx.world
    micro = min(cfg.micro_batch_size or local_batch, local_batch)
    if local_batch % micro:
        raise RFTError(f"micro_batch_size {micro} does not divide the per-process batch {local_batch}")

    install_cpu_backend()
    tokenizer = load_tokenizer(cfg.student, "student")
    saved_dtype = checkpoint_dtype(load_config(cfg.student, "student"))
    windows, data = finetune_windows(tokenizer, cfg)  # an unreachable corpus fails before any model loads
    student = load_causal_lm(cfg.student, "student",  # fp32 master weights; autocast computes in bf16 on CUDA
                             vocabulary_in_storage=ctx.device.type == "cpu")
    teacher = None
    if cfg.teacher is not None:
        teacher = load_causal_lm(cfg.teacher, "teacher", dtype=compute_dtype(ctx.device))  # frozen: its own dtype
        check_pair(student, teacher, cfg.student, cfg.teacher)
        teacher.requires_grad_(False).eval()
    key_heads = get_adapter(student).key_heads(student.config)

    lora_targets = resolve_lora_targets(student, cfg.lora_targets)
    torch.manual_seed(cfg.seed)
    model = build_student(student, cfg)
    model.train()
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    n_lora = sum(p.numel() for n, p in model.named_parameters() if p.requires_grad and "lora_" in n)
    return _Run(out=out, t_start=t_start, local_batch=local_batch, micro=micro, tokenizer=tokenizer,
                saved_dtype=saved_dtype, windows=windows, data=data, student=student, teacher=teacher,
                key_heads=list(key_heads), lora_targets=lora_targets, model=model, n_trainable=n_trainable,
                n_lora=n_lora, state_path=out / STATE_FILE)


def _resume(cfg: RFTConfig, ctx: DistContext, run: _Run) -> None:
    """Continue the run's checkpoint (resume) or start at step 0: the trainable parameters, the held-out
    perplexities before training, the model placed on the device (DDP, FSDP), the optimizer and scheduler, and
    for a checkpoint their states, every process's RNG, the step, the history and the log up to that step."""
    state = None
    if cfg.resume and run.state_path.exists():
        state = load_state(run.state_path)
        if state["config_hash"] != cfg.hash():
            diff = config_diff(state["config"], cfg.identity())
            raise RFTError(f"{run.state_path} was written by another RFT config (hash {state['config_hash']} != "
                           f"{cfg.hash()}); differing keys: " + "; ".join(diff) + ". Use another --out or --overwrite")
        load_trainable_state(run.model, state["trainable"])
    if cfg.eval_corpora and ctx.main:
        t_eval = time.time()
        run.ppl_before = state["ppl_before"] if state is not None else heldout_ppl(
            run.model, run.tokenizer, cfg.eval_corpora, cfg.eval_seq_len)
        run.eval_s += time.time() - t_eval

    _place(cfg, ctx, run)
    if state is not None:
        _load_optimizer_state(run.model, run.optimizer, state["optimizer"], ctx)
        run.scheduler.load_state_dict(state["scheduler"])
        rngs = state["rng"]
        _set_rng_state(rngs[ctx.rank] if len(rngs) == ctx.world else rngs[0])
        run.step, run.wall_before, run.history = state["step"], state["wall_s"], list(state["history"])
        run.last_saved = state["step"]
        log = run.out / LOG_FILE
        if ctx.main and log.exists():  # drop lines the interrupted attempt logged after the checkpoint
            kept = [ln for ln in log.read_text().splitlines() if json.loads(ln)["step"] <= run.step]
            write_text_atomic(log, "".join(ln + "\n" for ln in kept))
    elif ctx.main:
        (run.out / LOG_FILE).unlink(missing_ok=True)
    ctx.barrier()


def _place(cfg: RFTConfig, ctx: DistContext, run: _Run) -> None:
    """Student and teacher on the device, wrapped for DDP or sharded for FSDP; AdamW (no decay on vectors) with
    the warm-up/cosine schedule (lr_factor)."""
    run.model.to(ctx.device)
    if run.teacher is not None:
        run.teacher.to(ctx.device)
    run.named = sorted((n, p) for n, p in run.model.named_parameters() if p.requires_grad)
    run.wrapped = run.model
    if ctx.mode == "ddp":
        run.wrapped = DDP(run.model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
    elif ctx.mode == "fsdp":
        shard_fsdp(run.model, ctx)
        if run.teacher is not None:
            shard_fsdp(run.teacher, ctx)
        run.named = sorted((n, p) for n, p in run.model.named_parameters() if p.requires_grad)
    decay = [p for n, p in run.named if p.dim() >= 2]
    no_decay = [p for n, p in run.named if p.dim() < 2]
    run.optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                       {"params": no_decay, "weight_decay": 0.0}],
                                      lr=cfg.lr, betas=cfg.adam_betas, eps=cfg.adam_eps)
    run.scheduler = torch.optim.lr_scheduler.LambdaLR(run.optimizer, lambda s: lr_factor(s, cfg))


def _checkpoint(cfg: RFTConfig, ctx: DistContext, run: _Run, t_loop: float) -> None:
    """The state after `run.step` steps, written atomically by the main process (every process takes part)."""
    trainable = trainable_state(run.model)
    opt_state = _optimizer_state(run.model, run.optimizer, ctx)
    rngs = ctx.gather_object(_rng_state())
    if ctx.main:
        save_torch_atomic(run.state_path, {
            "config_hash": cfg.hash(), "config": cfg.identity(), "step": run.step, "trainable": trainable,
            "optimizer": opt_state, "scheduler": run.scheduler.state_dict(), "rng": rngs,
            "data_position": {"step": run.step, "seed": cfg.seed, "n_windows": int(run.windows.shape[0])},
            "history": run.history, "ppl_before": run.ppl_before,
            "wall_s": run.wall_before + time.time() - t_loop})
    run.last_saved = run.step
    ctx.barrier()


def _loop(cfg: RFTConfig, ctx: DistContext, run: _Run, logger: _Logger, stop_after: int | None) -> dict | None:
    """Train from `run.step` to `cfg.steps`, checkpointing every `save_every` steps and at the end. Returns
    {"stopped_at": step} when `stop_after` steps of this call ended it early, else None."""

    def autocast():  # bf16 on CUDA (fla's chunk kernels refuse fp32 there); fp32 on CPU
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=ctx.device.type == "cuda")

    t_loop, steps_here = time.time(), 0
    local_batch, micro, teacher = run.local_batch, run.micro, run.teacher
    while run.step < cfg.steps:
        if stop_after is not None and steps_here >= stop_after:
            return {"stopped_at": run.step}
        t_step = time.time()
        idx = batch_indices(run.step, run.windows.shape[0], cfg.batch_size, cfg.seed)
        local = run.windows[idx[ctx.rank * local_batch:(ctx.rank + 1) * local_batch]]  # [b, T]
        sums = torch.zeros(3, dtype=torch.float64)
        n_micro = local_batch // micro
        for i in range(n_micro):
            x = local[i * micro:(i + 1) * micro].to(ctx.device)
            sync = ctx.mode != "ddp" or i == n_micro - 1
            with (nullcontext() if sync else run.wrapped.no_sync()), autocast():
                t_logits = None
                if teacher is not None:
                    with torch.no_grad():
                        t_logits = teacher(input_ids=x).logits
                s_logits = run.wrapped(input_ids=x).logits
                loss, ce, kl = distillation_loss(s_logits, t_logits, x, cfg.kd_temperature, cfg.kd_weight,
                                                  cfg.ce_weight)
                (loss / n_micro).backward()
            sums += torch.tensor([loss.item(), ce.item(), kl.item()], dtype=torch.float64) / n_micro
        loss_v, ce_v, kl_v = ctx.mean(sums.tolist())
        if not math.isfinite(loss_v):
            where = f"step {run.last_saved} in {run.state_path}" if run.last_saved is not None else "none was written"
            raise RFTError(f"non-finite loss ({loss_v}) at step {run.step + 1} of {cfg.student}; stopped without "
                           f"saving; last good checkpoint: {where}. Lower lr (now {cfg.lr}) or check the data")
        grad_norm = torch.nn.utils.clip_grad_norm_([p for _, p in run.named], cfg.grad_clip)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        run.optimizer.step()
        run.scheduler.step()
        run.optimizer.zero_grad(set_to_none=True)
        run.step += 1
        steps_here += 1
        dt = time.time() - t_step
        rec = {"step": run.step, "loss": loss_v, "ce": ce_v, "kl": kl_v, "grad_norm": float(grad_norm),
               "lr": run.scheduler.get_last_lr()[0], "tokens_per_s": cfg.batch_size * cfg.seq_len / max(dt, 1e-9)}
        run.history.append(rec)
        logger.step(rec)
        if run.step % cfg.save_every == 0 or run.step == cfg.steps:
            _checkpoint(cfg, ctx, run, t_loop)
    run.train_s = time.time() - t_loop
    return None


def _save_merge(cfg: RFTConfig, ctx: DistContext, run: _Run, logger: _Logger) -> dict:
    """Merge LoRA into the student (in place; a fresh CPU student under FSDP), measure held-out perplexity after,
    save the merged model in the checkpoint's dtype and write the result record."""
    final_state = trainable_state(run.model)
    metrics = _metrics(run.history, cfg, run.wall_before + run.train_s)
    model_dir = run.out / MODEL_DIR
    run.teacher = None  # free the teacher before the merge: no third model copy
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()
    if ctx.main:
        if ctx.mode == "fsdp":  # the sharded model cannot merge in place: a fresh CPU student takes the state
            merged = merged_model(cfg.student, cfg, final_state)
        else:
            merged = run.model.merge_and_unload()  # in place, on the trained student
        merged.eval()
        for corpus, ppl in run.ppl_before.items():
            metrics[f"{corpus}_ppl_before"] = ppl
        if cfg.eval_corpora:
            t_eval = time.time()
            for corpus, ppl in heldout_ppl(merged, run.tokenizer, cfg.eval_corpora, cfg.eval_seq_len).items():
                metrics[f"{corpus}_ppl_after"] = ppl
            run.eval_s += time.time() - t_eval

        def write_extra(folder: Path) -> None:
            write_json_atomic(folder / "rft_config.json", cfg.to_dict())

        save_model_atomic(merged.to(run.saved_dtype), run.tokenizer, model_dir, overwrite=True,
                          write_extra=write_extra)
    ctx.barrier()
    # load, data, training (earlier attempts' loops included), merge and save; held-out evaluation excluded
    metrics["wall_time_s"] = run.wall_before + time.time() - run.t_start - run.eval_s
    metrics["train_time_s"] = run.wall_before + run.train_s
    metrics["eval_time_s"] = run.eval_s
    logger.summary(metrics)
    record = None
    if ctx.main:
        record = build_result(
            "rft", profile=cfg.profile, experiment=cfg.experiment, config=cfg.to_dict(), metrics=metrics,
            model=model_entry(model_dir), data=run.data, seeds={"rft": cfg.seed},
            wall_time_s=run.wall_before + time.time() - run.t_start,
            extra={"config_hash": cfg.hash(), "student": model_entry(cfg.student),
                   "teacher": model_entry(cfg.teacher) if cfg.teacher else None,
                   "model_type": run.student.config.model_type, "key_heads": run.key_heads,
                   "lora_targets": run.lora_targets,
                   "trainable_parameters": run.n_trainable, "lora_parameters": run.n_lora, "world_size": ctx.world,
                   "distributed": ctx.mode, "device": str(ctx.device), "wandb_dir": logger.wandb_dir,
                   "master_dtype": "float32", "saved_dtype": str(run.saved_dtype),
                   "micro_batch_size": run.micro,
                   "log": LOG_FILE, "checkpoint": STATE_FILE})
        write_result(run.out / RESULT_FILE, record)
    record = ctx.gather_object(record)[0] if ctx.enabled else record
    return record


def _metrics(history: list[dict], cfg: RFTConfig, train_s: float) -> dict:
    """`train_s`: the training loops of every attempt (a resumed run's tokens/s counts all its steps)."""
    tail = history[-max(1, min(10, len(history))):]
    avg = lambda k: float(np.mean([r[k] for r in tail]))
    return {"final_loss": avg("loss"), "final_ce": avg("ce"), "final_kl": avg("kl"),
            "first_loss": history[0]["loss"], "first_ce": history[0]["ce"], "last_loss": history[-1]["loss"],
            "steps": len(history), "tokens": len(history) * cfg.batch_size * cfg.seq_len,
            "tokens_per_s": len(history) * cfg.batch_size * cfg.seq_len / max(train_s, 1e-9)}
