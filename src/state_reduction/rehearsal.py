"""`state-reduction rehearse`: every stage of the paper profile on random-init models of the paper's exact
architectures, with tiny data budgets, before a cluster is booked (issue 22).

The architectures are committed config files (`experiments/rehearsal/configs/*.json`): DeltaNet and Gated
DeltaNet 370M and 1.3B, Mamba-Codestral-7B and the Qwen3.5 9B text model. Only the number of decoder blocks is
changed (`layers`); every other field, widths and vocabulary included, is the paper model's. A checkpoint of
random weights is saved in bf16 (as the hub checkpoints are) with the tiny tokenizer (8192 ids, all below every
vocabulary here; tokens carry no meaning for a rehearsal). Then, per model: prune with every selector at every
ratio, all at once and layer-streamed; reload each pruned checkpoint with the stock loader and run a forward;
RFT a few steps (the paper recipe but for steps, batch and data); evaluate a few examples of the tiny suite;
the decode and prefill benchmarks a few steps. Each stage records its wall time and heap peak (HeapPeak: bytes
above the stage's entry, the quantity `memory-plan` predicts on a CPU; on a GPU the CUDA allocator's peak), and prune
stages are compared with the plan's prediction; a prediction more than 25% off is flagged.
"""

from __future__ import annotations

import gc
import json
import shutil
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from state_reduction.atomic import write_json_atomic, write_text_atomic
from state_reduction.backend import install_cpu_backend
from state_reduction.checkpoints import load_model, save_model_atomic
from state_reduction.devices import compute_dtype, resolve_device
from state_reduction.errors import InputError
from state_reduction.evaluation import evaluate
from state_reduction.models.families import get_adapter
from state_reduction.peak_memory import HeapPeak, cuda_peak_bytes, host_peak_rss_bytes
from state_reduction.provenance import REPO_ROOT, TINY_MODELS_DIR, collect_provenance
from state_reduction.pruning.memory_plan import plan
from state_reduction.pruning.prune import PruneConfig, prune
from state_reduction.pruning.selectors import SELECTORS, get_selector
from state_reduction.results import build_result, read_result, results_dir, write_result
from state_reduction.rft import RFTConfig, run_rft
from state_reduction.speed.benchmarks import bench_decode, bench_prefill
from state_reduction.speed.timing import TimingProtocol

CONFIG_DIR = REPO_ROOT / "experiments" / "rehearsal" / "configs"
README = REPO_ROOT / "experiments" / "rehearsal" / "README.md"
FLAG_OFF = 0.25  # |predicted - measured| / measured above this is flagged
_PARTIAL: list[Path | None] = [None]  # rows so far, rewritten after every stage (a killed rehearsal keeps them)


class RehearsalError(InputError):
    """A rehearsal that cannot start; the message names the model, option or value and the accepted ones."""


def known_models() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


def model_config(name: str, layers: int | None, first_layer: int = 0):
    """The committed config of `name` with `layers` decoder blocks (Qwen3.5: `layers` consecutive entries of its
    layer_types from `first_layer`), every other field unchanged."""
    path = CONFIG_DIR / f"{name}.json"
    if not path.is_file():
        raise RehearsalError(f"rehearse: unknown model {name!r}; models: {', '.join(known_models())}")
    raw = json.loads(path.read_text())
    if first_layer and "layer_types" not in raw:
        raise RehearsalError(f"rehearse: --first-layer {first_layer} applies to configs with layer_types; {name} "
                             "has one kind of block")
    if layers is not None:
        if layers < 1:
            raise RehearsalError(f"rehearse: --layers must be >= 1, got {layers}")
        raw["num_hidden_layers"] = layers
        if "layer_types" in raw:
            if first_layer < 0 or first_layer + layers > len(raw["layer_types"]):
                raise RehearsalError(f"rehearse: --first-layer {first_layer} with --layers {layers}: {name} has "
                                     f"{len(raw['layer_types'])} layer_types")
            raw["layer_types"] = raw["layer_types"][first_layer:first_layer + layers]
    return AutoConfig.for_model(**raw)


def describe_blocks(config) -> str:
    types = getattr(config, "layer_types", None)
    return f"{config.num_hidden_layers} blocks" + (f" ({', '.join(types)})" if types else "")


def build_checkpoint(name: str, layers: int | None, out: Path, seed: int = 0, first_layer: int = 0) -> Path:
    """Random-init model of `name` saved in bf16 with the tiny tokenizer; returns the folder."""
    config = model_config(name, layers, first_layer)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)

    save_model_atomic(model, AutoTokenizer.from_pretrained(str(TINY_MODELS_DIR / "tokenizer")), out, overwrite=True)
    return out


@dataclass
class RehearsalConfig:
    models: list[str]
    out: str  # work folder for checkpoints (removed stage by stage) and the result
    layers: int | None = 2
    first_layer: int = 0  # configs with layer_types: the window of them the blocks follow
    methods: list[str] | None = None  # None: every registered selector
    ratios: list[float] = field(default_factory=lambda: [0.5, 0.75])
    streamed: list[bool] = field(default_factory=lambda: [False, True])
    n_calib: int = 2
    seq_len: int = 256
    batch_size: int = 2
    calib: str = "ptb"
    rft_steps: int = 2
    eval_limit: int = 2
    eval_suite: str = "tiny_choice"  # the tiny suite's choice tasks (its perplexity tasks read whole documents)
    bench_steps: int = 2
    stages: list[str] = field(default_factory=lambda: ["prune", "rft", "evaluate", "speed"])
    rft_models: list[str] | None = None  # None: every model
    seed: int = 0

    def validate(self) -> None:
        unknown = [m for m in self.models if m not in known_models()]
        if unknown or not self.models:
            raise RehearsalError(f"rehearse: unknown models {unknown or '(none given)'}; models: "
                                 f"{', '.join(known_models())}")
        bad = [m for m in (self.methods or []) if m not in SELECTORS]
        if bad:
            raise RehearsalError(f"rehearse: unknown methods {bad}; methods: {', '.join(sorted(SELECTORS))}")
        for m in self.models:
            model_config(m, self.layers, self.first_layer)  # a bad --layers / --first-layer fails before any work
        stages = {"prune", "rft", "evaluate", "speed"}
        if not set(self.stages) <= stages:
            raise RehearsalError(f"rehearse: unknown stages {sorted(set(self.stages) - stages)}; stages: "
                                 f"{', '.join(sorted(stages))}")


def _predicted_prune(config, cfg: RehearsalConfig, method: str, streamed: bool) -> int:
    """memory-plan's bytes for one prune on the CPU (fp32 weights, the bf16 checkpoint's embedding and head kept in
    bf16): the calibration peak (weights included); the weights alone for the weight-only selectors. Streamed on
    the CPU, home and device are one memory: the host plan plus the device plan less the weights the device plan
    counts again."""
    cuda = torch.cuda.is_available()  # prune computes on the GPU when present, in the checkpoint's bf16
    p = plan(config, cfg.n_calib, cfg.seq_len, cfg.batch_size, weight_bytes=2 if cuda else 4, grad_tokens=2048,
             vocab_bytes=2)
    selector = get_selector(method)
    if not selector.needs:
        return p["terms"]["weights"]
    kind = "grad" if selector.gradients else "forward"
    if not streamed:
        return p["device"][f"all_at_once_{kind}"]
    if cuda:
        return p["device"][f"streamed_{kind}"]
    return p["host"][f"streamed_{kind}"] + p["device"][f"streamed_{kind}"] - p["terms"]["largest_block"] \
        - p["terms"]["outside_blocks"]


def _run_stage(rows: list, model: str, stage: str, what: str, fn, predicted: int | None = None):
    gc.collect()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    peak = HeapPeak()
    value, error = None, None
    try:
        with peak:
            value = fn()
    except Exception as e:  # noqa: BLE001  (a failing stage is recorded red; the rehearsal goes on)
        error = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        traceback.print_exc()
    row = {"model": model, "stage": stage, "what": what, "ok": error is None, "error": error,
           "wall_s": round(time.perf_counter() - t0, 2), "heap_peak_bytes": int(peak.peak),
           "process_peak_rss_bytes": host_peak_rss_bytes(), "predicted_bytes": predicted,
           "cuda_peak_bytes": cuda_peak_bytes() if cuda else None}
    measured = row["cuda_peak_bytes"] if cuda else peak.peak  # what the plan predicts: the compute device's peak
    if predicted is not None and measured:
        row["predicted_off"] = round((predicted - measured) / measured, 3)
        row["flagged"] = abs(row["predicted_off"]) > FLAG_OFF
    rows.append(row)
    if _PARTIAL[0] is not None:
        write_json_atomic(_PARTIAL[0], {"rows": rows})
    status = "ok" if error is None else f"FAILED {error}"
    print(f"[rehearse] {model} {stage} {what}: {status} ({row['wall_s']} s, heap {peak.peak / 2**20:.0f} MiB"
          + (f", plan {predicted / 2**20:.0f} MiB" if predicted is not None else "") + ")", flush=True)
    gc.collect()
    return value


def _reload(folder: Path, key_dim: int) -> None:
    device = resolve_device(None)
    model = load_model(str(folder), dtype=compute_dtype(device)).to(device).eval()
    found = get_adapter(model).key_heads(model.config)[1]
    if found != key_dim:
        raise RehearsalError(f"reload {folder}: key dim {found}, selection.json says {key_dim}")
    ids = torch.randint(0, 8192, (1, 16), generator=torch.Generator().manual_seed(0)).to(device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    if not torch.isfinite(logits).all():
        raise FloatingPointError(f"reload {folder}: non-finite logits")


def _evaluate(folder: Path, limit: int, suite: str) -> dict:
    device = resolve_device(None)
    model = load_model(str(folder), dtype=compute_dtype(device)).to(device).eval()
    out = evaluate(model, AutoTokenizer.from_pretrained(str(folder)), suite=suite, batch_size=2, max_length=256,
                   limit=limit)
    return out["metrics"]


def _speed(folder: Path, steps: int) -> None:
    protocol = TimingProtocol(warmup=1, steps=steps, repeats=1)
    device = resolve_device(None)
    bench_decode(str(folder), device=device, batches=(1,), prompt_len=32, ratios=(0.5,), protocol=protocol,
                 cuda_graphs="auto")
    bench_prefill(str(folder), device=device, grid=((1, 64),), ratios=(0.5,), protocol=protocol)


def rehearse(cfg: RehearsalConfig) -> dict:
    """Run the rehearsal; returns the record (rows per stage) and writes `<out>/rehearsal.json`."""
    cfg.validate()
    install_cpu_backend()
    work = Path(cfg.out)
    work.mkdir(parents=True, exist_ok=True)
    methods = cfg.methods or sorted(SELECTORS)
    rows: list[dict] = []
    _PARTIAL[0] = work / "rehearsal.partial.json"
    t0 = time.time()
    started = collect_provenance()  # the code that runs (the result's provenance is read when it is written)
    for name in cfg.models:
        config = model_config(name, cfg.layers, cfg.first_layer)
        dense = work / f"{name}-dense"
        shutil.rmtree(dense, ignore_errors=True)
        _run_stage(rows, name, "build", f"random init, {describe_blocks(config)}, bf16",
                   lambda: build_checkpoint(name, cfg.layers, dense, cfg.seed, cfg.first_layer))
        kept_for_later = None
        if "prune" in cfg.stages:
            # by default every selector that serves the family (ghost needs a decay, which DeltaNet lacks)
            adapter = get_adapter(config)
            for method in [m for m in methods if cfg.methods or SELECTORS[m].missing(adapter) is None]:
                for ratio in cfg.ratios:
                    for streamed in cfg.streamed:
                        what = f"{method} r{round(ratio * 100)}{' streamed' if streamed else ''}"
                        folder = work / f"{name}-{method}-r{round(ratio * 100)}{'-s' if streamed else ''}"
                        record = _run_stage(rows, name, "prune", what, lambda: prune(PruneConfig(
                            model=str(dense), method=method, ratio=ratio, out=str(folder), calib=cfg.calib,
                            n_calib=cfg.n_calib, seq_len=cfg.seq_len, batch_size=cfg.batch_size, seed=cfg.seed,
                            stream_layers=streamed, overwrite=True)),
                            predicted=_predicted_prune(config, cfg, method, streamed))
                        if record is not None:
                            _run_stage(rows, name, "reload", what,
                                       lambda: _reload(folder, record["key_dim_after"]))
                        if kept_for_later is None and record is not None and ratio == 0.5 and not streamed:
                            kept_for_later = folder
                        else:
                            shutil.rmtree(folder, ignore_errors=True)
        student = kept_for_later or dense
        final = student
        if "rft" in cfg.stages and (cfg.rft_models is None or name in cfg.rft_models):
            rft_out = work / f"{name}-rft"
            shutil.rmtree(rft_out, ignore_errors=True)
            rft_cfg = RFTConfig.from_preset(
                "paper", str(student), str(dense), str(rft_out), corpora=[cfg.calib], steps=cfg.rft_steps,
                batch_size=cfg.batch_size, micro_batch_size=1, seq_len=cfg.seq_len, warmup_steps=1,
                save_every=cfg.rft_steps, progress=False, wandb="disabled", threads=torch.get_num_threads(),
                experiment="rehearsal")
            if _run_stage(rows, name, "rft", f"{cfg.rft_steps} steps of {cfg.batch_size} x {cfg.seq_len}",
                          lambda: run_rft(rft_cfg)) is not None:
                final = rft_out / "model"
        if "evaluate" in cfg.stages:
            _run_stage(rows, name, "evaluate", f"{cfg.eval_suite}, {cfg.eval_limit} examples per task",
                       lambda: _evaluate(final, cfg.eval_limit, cfg.eval_suite))
        if "speed" in cfg.stages:
            _run_stage(rows, name, "speed", f"decode b1 + prefill 1x64, {cfg.bench_steps} steps",
                       lambda: _speed(dense, cfg.bench_steps))
        for folder in work.glob(f"{name}-*"):
            shutil.rmtree(folder, ignore_errors=True)
    record = {"config": asdict(cfg), "device": str(resolve_device(None)), "rows": rows,
              "all_ok": all(r["ok"] for r in rows), "flagged": sum(bool(r.get("flagged")) for r in rows),
              "wall_time_s": round(time.time() - t0, 1),
              "code_at_start": {k: started.get(k) for k in ("git_commit", "git_dirty")}}
    write_json_atomic(work / "rehearsal.json", record)
    return record


def summary_table(record: dict) -> str:
    """Markdown: one line per stage with status, wall time, heap peak, plan and how far off it is."""
    def mib(b):
        return "" if b is None else f"{b / 2**20:,.0f}"

    lines = ["| model | stage | what | ok | wall s | heap peak MiB | plan MiB | plan off | flag |",
             "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in record["rows"]:
        off = r.get("predicted_off")
        lines.append(f"| {r['model']} | {r['stage']} | {r['what']} | {'yes' if r['ok'] else 'NO: ' + r['error']} | "
                     f"{r['wall_s']} | {mib(r['heap_peak_bytes'])} | {mib(r['predicted_bytes'])} | "
                     f"{'' if off is None else f'{off:+.0%}'} | {'> 25%' if r.get('flagged') else ''} |")
    return "\n".join(lines)


def write_outputs(record: dict, *, profile: str = "paper", results_root=None, readme: Path | None = None) -> Path:
    """The result JSON (results/<profile>/rehearsal/) and the summary table in the experiment README between
    `<!-- rehearsal:begin -->` and `<!-- rehearsal:end -->`."""
    cfg = record["config"]
    tag = f"{'_'.join(cfg['models'])}-L{cfg['layers']}" + (f"-F{cfg['first_layer']}" if cfg.get("first_layer") else "")
    metrics = {"stages": len(record["rows"]), "failed": sum(not r["ok"] for r in record["rows"]),
               "flagged": record["flagged"],
               "max_heap_peak_bytes": max((r["heap_peak_bytes"] for r in record["rows"]), default=0)}
    result = build_result("bench", profile=profile, experiment="rehearsal", config=cfg, metrics=metrics, model=None,
                          data={}, seeds={"init": cfg["seed"]}, wall_time_s=record["wall_time_s"],
                          extra={"rows": record["rows"], "device": record["device"],
                                 "code_at_start": record.get("code_at_start")})
    path = results_dir(profile, "rehearsal", results_root) / f"rehearsal-{tag}-{record['device']}.json"
    write_result(path, result)
    if readme is not None:
        write_readme(readme, profile=profile, results_root=results_root)
    return path


def write_readme(readme: Path, *, profile: str = "paper", results_root=None) -> None:
    """The summary tables of every rehearsal result of `profile`, between `<!-- rehearsal:begin -->` and
    `<!-- rehearsal:end -->` of the experiment README (rendered only from the result files)."""
    text = readme.read_text()
    begin, end = "<!-- rehearsal:begin -->", "<!-- rehearsal:end -->"
    if begin not in text or end not in text:
        raise RehearsalError(f"{readme}: no {begin} ... {end} block to write the rehearsal tables into")
    blocks = []
    for path in sorted(results_dir(profile, "rehearsal", results_root).glob("rehearsal-*.json")):
        r = read_result(path)
        cfg, m = r["config"], r["metrics"]
        shown = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
        window = f" from layer_types[{cfg['first_layer']}]" if cfg.get("first_layer") else ""
        start = (r["extra"].get("code_at_start") or {}).get("git_commit")
        code = f"; ran commit {start[:7]}" if start and start != r["provenance"].get("git_commit") else ""
        blocks.append(f"`{shown}`: {', '.join(cfg['models'])}; {cfg['layers']} blocks{window}; {r['extra']['device']}; "
                      f"{r['wall_time_s']:.0f} s; {m['stages']} stages, {m['failed']} failed, {m['flagged']} plans "
                      f"off by > 25%; largest heap peak {m['max_heap_peak_bytes'] / 2**30:.2f} GiB{code}\n\n"
                      + summary_table({"rows": r["extra"]["rows"]}))
    body = "\n\n".join(blocks) or "(no rehearsal results yet: `make rehearsal`)"
    write_text_atomic(readme, text[:text.index(begin)] + f"{begin}\n{body}\n{end}" + text[text.index(end) + len(end):])


def _cmd_rehearse(args) -> int:
    if args.no_streamed and args.only_streamed:
        raise RehearsalError("rehearse: --no-streamed and --only-streamed exclude each other")
    cfg = RehearsalConfig(models=args.models, out=args.out, layers=args.layers, first_layer=args.first_layer,
                          methods=args.methods,
                          ratios=args.ratios, streamed=[True] if args.only_streamed else [False] if args.no_streamed else [False, True],
                          n_calib=args.n_calib, seq_len=args.seq_len, batch_size=args.batch_size,
                          rft_steps=args.rft_steps, eval_limit=args.eval_limit, eval_suite=args.eval_suite,
                          bench_steps=args.bench_steps,
                          stages=args.stages, rft_models=args.rft_models)
    record = rehearse(cfg)
    path = write_outputs(record, results_root=args.results_root, readme=README if args.write_readme else None)
    print(summary_table(record))
    print(f"rehearsal: {len(record['rows'])} stages, {sum(not r['ok'] for r in record['rows'])} failed, "
          f"{record['flagged']} plans off by > 25%; {path}")
    return 0 if record["all_ok"] else 1


def register(subparsers) -> None:
    p = subparsers.add_parser("rehearse", help="every paper-profile stage on random-init models of the paper's "
                                               "exact architectures, tiny data budgets (CPU or GPU)")
    p.add_argument("models", nargs="+", help=f"one or more of: {', '.join(known_models())}")
    p.add_argument("--layers", type=int, default=2, help="decoder blocks (every other field is the paper model's)")
    p.add_argument("--first-layer", type=int, default=0,
                   help="models with layer_types (Qwen3.5): the blocks follow layer_types from this index")
    p.add_argument("--methods", nargs="+", default=None, help="selectors (default: all)")
    p.add_argument("--ratios", nargs="+", type=float, default=[0.5, 0.75])
    p.add_argument("--no-streamed", action="store_true", help="skip the layer-streamed prunes")
    p.add_argument("--only-streamed", action="store_true", help="only the layer-streamed prunes (the paper "
                   "profile's for Mamba-2 and Qwen3.5)")
    p.add_argument("--n-calib", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--rft-steps", type=int, default=2)
    p.add_argument("--eval-limit", type=int, default=2)
    p.add_argument("--eval-suite", default="tiny_choice", help="tiny_choice (default), tiny, tiny_ppl")
    p.add_argument("--bench-steps", type=int, default=2)
    p.add_argument("--stages", nargs="+", default=["prune", "rft", "evaluate", "speed"])
    p.add_argument("--rft-models", nargs="+", default=None, help="models that run RFT (default: all)")
    p.add_argument("--out", default=str(REPO_ROOT / "runs" / "rehearsal"), help="work folder")
    p.add_argument("--results-root", default=None)
    p.add_argument("--write-readme", action="store_true", help="put the summary table in experiments/rehearsal/README.md")
    p.set_defaults(func=_cmd_rehearse)
