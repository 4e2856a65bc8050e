"""`state-reduction bench pipeline`: where the time of one table cell goes (issue 20, part 1).

One cell of a table (default: Table 20's DeltaNet, DRRQR, 50%) is run through the pipeline's own stages in a fresh
results folder (`pipeline.Runner`: the same configurations and code as `make table20`), and timed stage by stage:

- prune: load, calibration, selection, surgery and save (`pruning.prune` records them as `stage_seconds`);
- RFT: the whole recovery fine-tuning (`Runner.ensure_rft`);
- evaluation of the post-RFT model with the table's suite and settings, split into the model's forward calls and
  the rest (lm-eval's request building, batching, log-softmax and scoring: "harness overhead"); a cProfile of it
  names the largest costs.

In the same run, the bare forward of the same model over the very batches lm-eval fed it (captured, then replayed
under `torch.inference_mode`) gives the bound the evaluation is held to: `evaluation_vs_bare` = evaluation seconds /
bare forward seconds (issue 20's target: <= 2, i.e. the suite's tokens/s >= 0.5x the bare forward's).
"""

from __future__ import annotations

import cProfile
import io
import json
import pstats
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from state_reduction.backend import install_cpu_backend
from state_reduction.errors import InputError
from state_reduction.evaluation import evaluate
from state_reduction.evaluation.run import load_causal_lm
from state_reduction.pipeline import Cell, Runner, load_experiment, profile_spec
from state_reduction.results import build_result
from state_reduction.speed.benchmarks import hardware_name
from state_reduction.speed.models import backend_label


@contextmanager
def forward_recorder(model):
    """Record every forward call of `model`: its input_ids and the wall seconds it took (yields the two lists)."""
    inputs, seconds = [], []
    original = model.forward
    shadowed = vars(model).get("forward")  # an instance attribute already there (e.g. a hook), put back after

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        out = original(*args, **kwargs)
        seconds.append(time.perf_counter() - t0)
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None:
            inputs.append(ids.detach().clone())
        return out

    model.forward = timed
    try:
        yield inputs, seconds
    finally:
        if shadowed is None:
            del model.forward  # our instance attribute shadowed the class's method
        else:
            model.forward = shadowed


def bare_forward_seconds(model, inputs: list[torch.Tensor]) -> float:
    """Wall seconds of the model's forward over `inputs` (the batches the evaluation fed it), nothing else."""
    t0 = time.perf_counter()
    with torch.inference_mode():
        for ids in inputs:
            model(input_ids=ids)
    return time.perf_counter() - t0


def profile_summary(profiler: cProfile.Profile, top: int) -> list[dict]:
    """The `top` functions by own (tottime) seconds: {function, calls, tottime_s, cumtime_s}."""
    stats = pstats.Stats(profiler, stream=io.StringIO())
    rows = []
    for (file, line, name), (_, calls, tottime, cumtime, _) in stats.stats.items():
        rows.append({"function": f"{Path(file).name}:{line}({name})", "calls": int(calls),
                     "tottime_s": round(tottime, 3), "cumtime_s": round(cumtime, 3)})
    return sorted(rows, key=lambda r: -r["tottime_s"])[:top]


def bench_pipeline(experiment: str = "deltanet_gdn", model: str = "deltanet", method: str = "drrqr",
                   ratio: float = 0.5, profile: str = "tiny", work_dir: str | Path | None = None,
                   limit: float | None = None, top: int = 12) -> dict:
    """Run and time one cell (`model` key of `experiment`'s `profile`, `method`, `ratio`) in `work_dir` (a fresh
    temporary folder by default, so nothing is reused); `limit` overrides the evaluation's examples per task."""
    torch.manual_seed(0)
    spec = load_experiment(experiment)
    p = profile_spec(spec, profile)
    if model not in p["models"]:
        raise InputError(f"bench pipeline: model {model!r} is not in experiment {experiment} ({profile}); "
                         f"models: {', '.join(p['models'])}")
    evaluate_settings = {**p["evaluate"], **({"limit": limit} if limit is not None else {})}
    install_cpu_backend()
    with tempfile.TemporaryDirectory(prefix="bench_pipeline_") as tmp:
        root = Path(work_dir) if work_dir is not None else Path(tmp)
        runner = Runner(spec, profile, results_root=root, evaluate=(evaluate_settings, ""))
        cell = Cell(model, method, ratio)
        t0 = time.perf_counter()
        pruned = runner.ensure_pruned(cell)
        prune_s = time.perf_counter() - t0
        stage_seconds = json.loads((pruned / "selection.json").read_text())["stage_seconds"]
        t0 = time.perf_counter()
        merged = runner.ensure_rft(cell)
        rft_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        lm, tokenizer = load_causal_lm(str(merged))
        load_eval_s = time.perf_counter() - t0
        profiler = cProfile.Profile()
        with forward_recorder(lm) as (inputs, forward_s):
            t0 = time.perf_counter()
            profiler.enable()
            out = evaluate(lm, tokenizer, suite=evaluate_settings["suite"], batch_size=evaluate_settings["batch_size"],
                           max_length=evaluate_settings["max_length"], limit=evaluate_settings["limit"])
            profiler.disable()
            evaluate_s = time.perf_counter() - t0
        bare_s = bare_forward_seconds(lm, inputs)

    cpu = torch.device("cpu")
    tokens = sum(int(ids.numel()) for ids in inputs)
    forward_total = sum(forward_s)
    stages = {f"prune.{k}": v for k, v in stage_seconds.items()}
    stages.update({"prune (whole stage, with the result file)": round(prune_s, 3), "rft": round(rft_s, 3),
                   "evaluation.load": round(load_eval_s, 3), "evaluation.model_forward": round(forward_total, 3),
                   "evaluation.harness_overhead": round(evaluate_s - forward_total, 3),
                   "evaluation": round(evaluate_s, 3)})
    metrics = {
        "evaluation_s": evaluate_s, "evaluation_forward_s": forward_total, "bare_forward_s": bare_s,
        "evaluation_vs_bare": evaluate_s / bare_s, "harness_share": (evaluate_s - forward_total) / evaluate_s,
        "evaluation_tokens_per_s": tokens / evaluate_s, "bare_tokens_per_s": tokens / bare_s,
        "prune_s": prune_s, "rft_s": rft_s,
    }
    config = {"mode": "pipeline", "experiment": experiment, "model": model, "method": method, "ratio": ratio,
              "evaluate": evaluate_settings, "rft": p["rft"], "device": "cpu", "threads": torch.get_num_threads()}
    return build_result("bench", profile=profile, experiment="speed", config=config, metrics=metrics,
                        wall_time_s=prune_s + rft_s + load_eval_s + evaluate_s + bare_s,
                        extra={"mode": "pipeline", "hardware": hardware_name(cpu),
                               "backend": backend_label(cpu),
                               "stages": stages, "forward_calls": len(inputs), "tokens_fed": tokens,
                               "batch_shapes": sorted({tuple(ids.shape) for ids in inputs}),
                               "evaluation_profile": profile_summary(profiler, top),
                               "suite_metrics": out["metrics"]})


def format_pipeline(record: dict) -> str:
    """The stage table, the ratios and the profile's largest costs, as `bench pipeline` prints them."""
    m, x = record["metrics"], record["extra"]
    c = record["config"]
    lines = [f"bench pipeline: {c['experiment']} {c['model']} {c['method']} {c['ratio']:g} ({record['profile']}), "
             f"{x['hardware']}, {c['threads']} thread(s)", f"{'stage':<44}{'seconds':>10}"]
    lines += [f"{k:<44}{v:>10.3f}" for k, v in x["stages"].items()]
    lines += [f"bare forward of the same {x['forward_calls']} batches ({x['tokens_fed']} tokens): "
              f"{m['bare_forward_s']:.2f} s",
              f"evaluation / bare forward: {m['evaluation_vs_bare']:.2f}x (target <= 2x); harness share of the "
              f"evaluation: {100 * m['harness_share']:.1f}%; tokens/s {m['evaluation_tokens_per_s']:.0f} (evaluation) "
              f"vs {m['bare_tokens_per_s']:.0f} (bare)",
              "largest own times in the evaluation (cProfile):"]
    lines += [f"  {r['tottime_s']:>8.2f} s  {r['calls']:>7}x  {r['function']}" for r in x["evaluation_profile"]]
    return "\n".join(lines)
