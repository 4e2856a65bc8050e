"""Pretraining of the tiny profile's models: one YAML config per model, resumable, logged.

A config with an `mqar` section trains on a mixture: each step's batch holds `batch_size` text windows and
`mqar.batch` synthetic MQAR sequences (`state_reduction.data.mqar`) of the same length, drawn as a pure
function of (seed, step); the loss is `mqar.text_weight` (default 1) times the text tokens' mean cross-entropy
plus the recalled values' mean cross-entropy (Zoology scores only the values of the queries). A small text weight
matters: with gradient clipping, the text gradient otherwise dominates the clipped norm and MQAR stays on its
plateau (measured: deltanet_mqar at weight 1 was still at chance, 2.78 nats, after 700 steps). `mqar.text_from_step`
(default 0) trains on MQAR alone before that step, a curriculum: the delta-rule models leave the MQAR plateau only
without the text loss (measured: deltanet_mqar at weight 0.02 stayed at 2.78 nats for 1000 steps; MQAR alone left it
at about step 250).

A run keeps its state in `run_dir` (model, optimiser, scheduler, RNG, step) and writes it atomically
every `checkpoint_every` steps, so a killed run resumes where it stopped. The batch of step `s` is a
pure function of (seed, s), so a resumed run sees exactly the data an uninterrupted one would.
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
from tqdm.auto import tqdm

from state_reduction.atomic import save_torch_atomic, write_json_atomic, write_text_atomic
from state_reduction.checkpoints import load_run_state
from state_reduction.checkpoints import save_model_atomic
from state_reduction.data import get_corpus_info, sample_sequences
from state_reduction.data.mqar import IGNORE_INDEX, MQARVocab, mqar_mixed_pairs, mqar_sequences
from state_reduction.data.sampler import stream_tokens
from state_reduction.errors import InputError
from state_reduction.evaluation.mqar import mqar_accuracy
from state_reduction.hashing import config_key
from state_reduction.models import FAMILIES, build_model, get_family
from state_reduction.provenance import collect_provenance
from state_reduction.tokenizer import load_tokenizer, tokenizer_hash
from state_reduction.training.schedule import warmup_cosine

EVAL_CORPORA = ("ptb", "wiki")


@dataclass
class PretrainConfig:
    name: str
    family: str
    model: dict
    corpora: dict[str, float] = field(default_factory=lambda: {"ptb": 1.0, "wiki": 1.0, "books": 1.0, "bible": 1.0})
    seq_len: int = 256
    batch_size: int = 16
    steps: int = 1000
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    adam_betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    seed: int = 0
    checkpoint_every: int = 100
    eval_batch_size: int = 16
    threads: int = 0
    mqar: dict | None = None  # {batch, min_pairs, max_pairs, vocab: MQARVocab fields, eval_pairs: [..]}
    decay_half_life: tuple[float, float] | None = None  # [low, high] tokens: initial decay (family.decay_init)

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides) -> PretrainConfig:
        raw = yaml.safe_load(Path(path).read_text())
        raw.update({k: v for k, v in overrides.items() if v is not None})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise InputError(f"{path}: unknown pretraining config keys {unknown}; known: {sorted(known)}")
        family = get_family(raw["family"])
        if raw.get("decay_half_life") is not None:
            raw["decay_half_life"] = _check_half_life(path, family, raw["decay_half_life"])
        if raw.get("mqar") is not None:
            _check_mqar_section(path, raw["mqar"])
        if "adam_betas" in raw:
            raw["adam_betas"] = tuple(raw["adam_betas"])
        return cls(**raw)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["adam_betas"] = list(self.adam_betas)
        for key in ("mqar", "decay_half_life"):  # configs without them keep the identity (hash) they had before
            if d[key] is None:
                del d[key]
            elif key == "decay_half_life":
                d[key] = list(d[key])
        return d

    def mqar_vocab(self):
        return MQARVocab(**(self.mqar or {}).get("vocab", {}))

    def hash(self) -> str:
        """Identity of the run: everything but the thread count."""
        d = {k: v for k, v in self.to_dict().items() if k != "threads"}
        return config_key(d)


MQAR_KEYS = ("batch", "min_pairs", "max_pairs", "vocab", "eval_pairs", "text_weight", "text_from_step",
             "start_max_pairs", "start_steps")


def _check_mqar_section(path, section: dict) -> None:
    unknown = sorted(set(section) - set(MQAR_KEYS))
    if unknown:
        raise ValueError(f"{path}: unknown mqar keys {unknown}; known: {list(MQAR_KEYS)}")
    missing = [k for k in ("batch", "min_pairs", "max_pairs") if k not in section]
    if missing:
        raise ValueError(f"{path}: mqar section lacks {missing}")
    if ("start_max_pairs" in section) != ("start_steps" in section):
        raise InputError(f"{path}: mqar.start_max_pairs and mqar.start_steps go together (the pair-count "
                         f"curriculum), got only {[k for k in ('start_max_pairs', 'start_steps') if k in section]}")
    if "start_max_pairs" in section and not section["min_pairs"] <= section["start_max_pairs"] <= section["max_pairs"]:
        raise InputError(f"{path}: mqar.start_max_pairs must lie in [min_pairs, max_pairs] = "
                         f"[{section['min_pairs']}, {section['max_pairs']}], got {section['start_max_pairs']}")
    MQARVocab(**section.get("vocab", {}))


def _check_half_life(path, family, value) -> tuple[float, float]:
    if family.decay_init is None:
        with_gate = sorted(f.name for f in FAMILIES.values() if f.decay_init is not None)
        raise InputError(f"{path}: decay_half_life: family {family.name!r} has no decay gate to initialise; "
                         f"families with one: {with_gate}")
    if not (isinstance(value, (list, tuple)) and len(value) == 2
            and all(isinstance(v, (int, float)) and v > 0 for v in value) and value[0] <= value[1]):
        raise InputError(f"{path}: decay_half_life must be [low, high] tokens with 0 < low <= high, got {value!r}")
    return float(value[0]), float(value[1])


def lr_factor(step: int, cfg: PretrainConfig) -> float:
    """Linear warm-up, then cosine from 1 to `min_lr_ratio` at the last step (training.schedule)."""
    return warmup_cosine(step, cfg.steps, cfg.warmup_steps, cfg.min_lr_ratio)


def build_training_windows(tokenizer, cfg: PretrainConfig, data_dir=None) -> tuple[torch.Tensor, dict]:
    """All pretraining-stream windows of the mix, [N, seq_len], and per-corpus token counts.

    Each corpus contributes floor(weight * available) windows of its `pretrain` stream."""
    parts, counts = [], {}
    for i, (corpus, weight) in enumerate(sorted(cfg.corpora.items())):
        n_avail = len(stream_tokens(tokenizer, corpus, "pretrain", data_dir=data_dir)) // cfg.seq_len
        n = max(1, int(min(1.0, weight) * n_avail))
        windows = sample_sequences(tokenizer, corpus, n=n, seq_len=cfg.seq_len, seed=cfg.seed + i,
                                   stream="pretrain", data_dir=data_dir)
        parts.append(windows)
        counts[corpus] = int(windows.numel())
    return torch.cat(parts), counts


def batch_indices(step: int, n_windows: int, batch_size: int, seed: int) -> torch.Tensor:
    """Indices of step `step`'s batch: epochs of seeded permutations, a pure function of the step."""
    per_epoch = n_windows // batch_size
    epoch, pos = divmod(step, per_epoch)
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    perm = torch.randperm(n_windows, generator=g)
    return perm[pos * batch_size:(pos + 1) * batch_size]


def _autocast(device: torch.device):
    """bf16 autocast on CUDA (fla's chunk kernels refuse fp32 there); plain fp32 on CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=torch.device(device).type == "cuda")


@torch.no_grad()
def window_nll(model, tokens: torch.Tensor, seq_len: int, batch_size: int, desc: str = "eval") -> torch.Tensor:
    """Per-target negative log-likelihood over non-overlapping windows of `seq_len` tokens.

    Returns [N_windows, seq_len - 1]; the first token of each window is context only."""
    model.eval()
    n = tokens.numel() // seq_len
    windows = tokens[: n * seq_len].view(n, seq_len)
    out = []
    for i in tqdm(range(0, n, batch_size), desc=desc, leave=False, disable=n <= batch_size):
        x = windows[i:i + batch_size].to(model.device)
        with _autocast(model.device):
            logits = model(input_ids=x).logits.float()
        logp = torch.log_softmax(logits[:, :-1], dim=-1)
        out.append(-logp.gather(-1, x[:, 1:, None]).squeeze(-1).cpu())
    return torch.cat(out)


def unigram_nll(train_counts: torch.Tensor, tokens: torch.Tensor, seq_len: int) -> torch.Tensor:
    """NLL of the same targets as `window_nll` under an add-one-smoothed unigram model of the training data."""
    logp = torch.log((train_counts.double() + 1) / (train_counts.sum() + train_counts.numel()))
    n = tokens.numel() // seq_len
    targets = tokens[: n * seq_len].view(n, seq_len)[:, 1:]
    return -logp[targets]


def pretrain(cfg: PretrainConfig, tokenizer_dir: str | Path, out_dir: str | Path, run_dir: str | Path,
             data_dir=None, device: str = "cpu", resume: bool = True) -> dict:
    """Train `cfg`'s model, save it with the tokenizer and a training record to `out_dir`."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out_dir, run_dir = Path(out_dir), Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(tokenizer_dir)
    model_kwargs = dict(cfg.model, vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id,
                        bos_token_id=tokenizer.bos_token_id, pad_token_id=tokenizer.pad_token_id)
    model = build_model(cfg.family, model_kwargs, seed=cfg.seed).to(device)
    if cfg.decay_half_life is not None:
        get_family(cfg.family).decay_init(model, *cfg.decay_half_life, seed=cfg.seed)
    windows, corpus_tokens = build_training_windows(tokenizer, cfg, data_dir=data_dir)
    if windows.shape[0] < cfg.batch_size:
        raise InputError(f"{cfg.name}: only {windows.shape[0]} training windows of {cfg.seq_len} tokens, "
                         f"fewer than batch_size={cfg.batch_size}")

    wall = train(model, windows, cfg, run_dir, device=device, resume=resume)

    eval_report = evaluate_against_unigram(model, tokenizer, cfg, data_dir=data_dir)
    if cfg.mqar:
        eval_report["mqar"] = evaluate_mqar_recall(model, cfg)
    losses = [json.loads(line)["loss"] for line in (run_dir / "log.jsonl").read_text().splitlines()]
    record = {
        "name": cfg.name, "family": cfg.family, "config": cfg.to_dict(), "config_hash": cfg.hash(),
        "n_parameters": sum(p.numel() for p in model.parameters()),
        "train_tokens_seen": cfg.steps * cfg.batch_size * cfg.seq_len,
        "train_tokens_available": corpus_tokens,
        "wall_time_s": round(wall, 1),
        "final_train_loss": float(np.mean(losses[-20:])) if losses else None,
        "eval": eval_report,
        "data": {c: {"sha256": get_corpus_info(c).sha256, "package": f"{get_corpus_info(c).package}=={get_corpus_info(c).version}"}
                 for c in sorted(set(cfg.corpora) | set(EVAL_CORPORA))},
        "tokenizer_sha256": tokenizer_hash(tokenizer_dir),
        "provenance": collect_provenance(),
    }
    save_checkpoint(model, tokenizer, record, out_dir)
    return record


def train(model, windows: torch.Tensor, cfg: PretrainConfig, run_dir: Path, device: str = "cpu",
          resume: bool = True, stop_at: int | None = None) -> float:
    """The training loop over `windows` [N, seq_len]; returns wall seconds (earlier attempts included).

    `stop_at` ends the call early after that many steps, as a kill would (used by the resume test)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=cfg.lr, betas=cfg.adam_betas, eps=1e-8)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, cfg))

    state_path = run_dir / "state.pt"
    log_path = run_dir / "log.jsonl"
    step, wall_before = 0, 0.0
    if resume and state_path.exists():
        state = load_run_state(state_path, cfg.hash(), ("step", "model", "optimizer", "scheduler", "rng", "wall_s"),
                               f"pretraining run {cfg.name}", hint=f"delete {run_dir} or pass --no-resume")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"])
        step, wall_before = state["step"], state["wall_s"]
        if log_path.exists():  # drop lines logged after the checkpoint by the interrupted attempt
            kept = [ln for ln in log_path.read_text().splitlines() if json.loads(ln)["step"] <= step]
            write_text_atomic(log_path, "".join(ln + "\n" for ln in kept))
    elif log_path.exists():
        log_path.unlink()

    model.train()
    t0 = time.time()
    bar = tqdm(total=cfg.steps, initial=step, desc=f"pretrain {cfg.name}", dynamic_ncols=True)
    loss_ema = None
    while step < cfg.steps:
        if stop_at is not None and step >= stop_at:
            break
        x = windows[batch_indices(step, windows.shape[0], cfg.batch_size, cfg.seed)].to(device)
        t_step = time.time()
        with _autocast(x.device):
            if cfg.mqar:
                loss, parts = mixed_mqar_loss(model, x, step, cfg)
            else:
                loss, parts = model(input_ids=x, labels=x).loss, {}
        if not torch.isfinite(loss):
            raise FloatingPointError(f"{cfg.name}: loss is {loss.item()} at step {step}")
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        loss_v = loss.item()
        loss_ema = loss_v if loss_ema is None else 0.95 * loss_ema + 0.05 * loss_v
        tok_s = x.numel() / max(1e-9, time.time() - t_step)
        bar.set_postfix(loss=f"{loss_ema:.3f}", tok_s=f"{tok_s:.0f}")
        bar.update(1)
        with open(log_path, "a") as f:
            f.write(json.dumps({"step": step, "loss": loss_v, "grad_norm": float(grad_norm),
                                "lr": scheduler.get_last_lr()[0], **parts}) + "\n")
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            save_torch_atomic(state_path, {
                "config_hash": cfg.hash(), "step": step, "model": model.state_dict(),
                "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "rng": torch.get_rng_state(), "wall_s": wall_before + time.time() - t0})
    bar.close()
    return wall_before + time.time() - t0


def mqar_training_batch(step: int, cfg: PretrainConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Step `step`'s MQAR sequences and labels, [mqar.batch, seq_len] each: a pure function of (seed, step).

    Before step `mqar.start_steps` the pairs are drawn from [min_pairs, start_max_pairs] (a pair-count curriculum)."""
    m = cfg.mqar
    max_pairs = m["start_max_pairs"] if step < m.get("start_steps", 0) else m["max_pairs"]
    return mqar_mixed_pairs(m["batch"], cfg.seq_len, m["min_pairs"], max_pairs,
                            seed=cfg.seed * 1_000_003 + 7919 * step + 1, vocab=cfg.mqar_vocab())


def mixed_mqar_loss(model, text: torch.Tensor, step: int, cfg: PretrainConfig) -> tuple[torch.Tensor, dict]:
    """`text_weight` x mean next-token CE over `text` [B, T] plus mean CE over the recalled values of the step's MQAR
    batch; before step `text_from_step` the text weight is 0 (MQAR alone).

    One backbone forward over both; the LM head runs only where a position is scored (all text positions, the
    queried keys of MQAR), which keeps an 8192-token head cheap on MQAR rows."""
    mqar_ids, mqar_labels = mqar_training_batch(step, cfg)
    x = torch.cat([text, mqar_ids.to(text.device)])
    hidden = model.base_model(input_ids=x)[0]  # [B_text + B_mqar, T, D]
    head = model.get_output_embeddings()
    b = text.shape[0]
    loss_text = torch.nn.functional.cross_entropy(
        head(hidden[:b, :-1]).flatten(0, 1).float(), text[:, 1:].flatten())
    targets = mqar_labels[:, 1:].to(text.device)
    scored = targets != IGNORE_INDEX
    loss_mqar = torch.nn.functional.cross_entropy(head(hidden[b:, :-1][scored]).float(), targets[scored])
    text_weight = cfg.mqar.get("text_weight", 1.0) if step >= cfg.mqar.get("text_from_step", 0) else 0.0
    loss = text_weight * loss_text + loss_mqar
    return loss, {"loss_text": loss_text.item(), "loss_mqar": loss_mqar.item()}


def pretrain_unigram_counts(tokenizer, corpora, data_dir=None) -> torch.Tensor:
    """Token counts [V] of the `pretrain` streams of `corpora`: the unigram baseline's training data."""
    counts = torch.zeros(len(tokenizer), dtype=torch.long)
    for corpus in sorted(corpora):
        tokens = torch.from_numpy(stream_tokens(tokenizer, corpus, "pretrain", data_dir=data_dir))
        counts += torch.bincount(tokens, minlength=len(tokenizer))
    return counts


def evaluate_against_unigram(model, tokenizer, cfg: PretrainConfig, data_dir=None) -> dict:
    """Held-out token perplexity on ptb/wiki test next to an add-one unigram model of the pretraining streams."""
    counts = pretrain_unigram_counts(tokenizer, cfg.corpora, data_dir=data_dir)
    report = {}
    for corpus in EVAL_CORPORA:
        tokens = torch.from_numpy(stream_tokens(tokenizer, corpus, "evaluation", split="test", data_dir=data_dir))
        nll = window_nll(model, tokens, cfg.seq_len, cfg.eval_batch_size, desc=f"eval {corpus}")
        uni = unigram_nll(counts, tokens, cfg.seq_len)
        ppl, uni_ppl = math.exp(nll.double().mean().item()), math.exp(uni.mean().item())
        report[f"{corpus}_test"] = {"tokens": int(nll.numel()), "ppl": ppl, "unigram_ppl": uni_ppl,
                                    "ratio_to_unigram": ppl / uni_ppl}
    return report


MQAR_EVAL_SEED = 10**9  # far from every training step's seed
MQAR_EVAL_QUERIES = 2048


@torch.no_grad()
def evaluate_mqar_recall(model, cfg: PretrainConfig) -> dict:
    """MQAR accuracy at the training length for each of `mqar.eval_pairs` (>= MQAR_EVAL_QUERIES queries each)."""
    report = {}
    for n_pairs in cfg.mqar.get("eval_pairs", [cfg.mqar["max_pairs"]]):
        n = -(-MQAR_EVAL_QUERIES // n_pairs)
        ids, labels = mqar_sequences(n, cfg.seq_len, n_pairs, MQAR_EVAL_SEED + n_pairs, cfg.mqar_vocab())
        correct, total = mqar_accuracy(model, ids, labels, batch_size=cfg.eval_batch_size)
        report[f"pairs_{n_pairs}"] = {"accuracy": correct / total, "queries": total, "length": cfg.seq_len}
    return report


def save_checkpoint(model, tokenizer, record: dict, out_dir: str | Path) -> None:
    """safetensors + config + tokenizer + training_record.json, replacing `out_dir` atomically."""
    save_model_atomic(model, tokenizer, out_dir, overwrite=True,
                      write_extra=lambda folder: write_json_atomic(folder / "training_record.json", record))
