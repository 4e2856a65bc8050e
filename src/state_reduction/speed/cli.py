"""`state-reduction bench {calibration,decode,prefill,mixer,recurrence,state-memory,pipeline,selectors}`."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from transformers import AutoConfig

from state_reduction.atomic import write_json_atomic, write_text_atomic
from state_reduction.errors import InputError, MissingInputError
from state_reduction.models import build_config, register_auto_classes
from state_reduction.models.families import get_adapter
from state_reduction.options import length_int, nonnegative_int, positive_int
from state_reduction.provenance import REPO_ROOT, collect_provenance
from state_reduction.pruning.calibration_cost import bench_calibration, format_calibration
from state_reduction.results import build_result, results_dir, write_result
from state_reduction.speed import benchmarks as sb
from state_reduction.speed.benchmarks import BenchError
from state_reduction.speed.models import PRESETS
from state_reduction.speed.selector_cost import bench_selectors, format_selectors, selectors_markdown
from state_reduction.speed.state_bytes import DTYPES, parse_bytes, state_memory_rows
from state_reduction.speed.timing import TimingProtocol

TINY_CHECKPOINTS = REPO_ROOT / "experiments" / "tiny_models" / "checkpoints"

MODES = ("calibration", "decode", "prefill", "mixer", "recurrence", "state-memory", "pipeline", "selectors")
DEFAULT_MODEL = str(TINY_CHECKPOINTS / "gated_deltanet")


def _protocol(args):
    return TimingProtocol(args.warmup, args.steps, args.repeats)


def _dtype(name):
    if name is None:
        return None
    if name not in DTYPES:
        raise InputError(f"--dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    return DTYPES[name]


def _grid(text: str) -> tuple[int, int]:
    try:
        b, t = text.lower().split("x")
        t = int(t[:-1]) * 1024 if t.endswith("k") else int(t)
        return int(b), t
    except ValueError:
        raise argparse.ArgumentTypeError(f"grid cell {text!r}: expected BxT, e.g. 4x2048 or 4x2k") from None


def _out_path(args, record: dict, tag: str) -> Path:
    if args.out:
        return Path(args.out)
    return results_dir(args.profile, "speed", args.results_root) / f"{args.mode.replace('-', '_')}_{tag}_{record['config']['device']}.json"


def _tag(model: str) -> str:
    return Path(model).name if Path(model).is_dir() else model


def format_rows(record: dict) -> str:
    mode, rows = record["extra"]["mode"], record["extra"]["rows"]
    head = f"bench {mode} on {record['extra']['hardware']} ({record['extra']['backend']})"
    lines = [head]
    if mode == "recurrence":
        lines.append(f"{'level':<11}{'d_k':>5}{'ms':>10}{'speedup':>9}{'bound':>7}{'rec. share':>11}{'Amdahl':>8}"
                     f"{'copy ms':>9}{'x copy':>8}")
        lines += [f"{r['level']:<11}{r['d_k']:>5}{r['ms']:>10.3f}{r['speedup']:>8.2f}x{r['state_bound']:>6.1f}x"
                  f"{r['recurrence_share']:>11.3f}{r['amdahl_bound']:>7.2f}x"
                  + (f"{r['copy_ms']:>9.3f}{r['traffic_bound_multiple']:>7.2f}x" if "copy_ms" in r else "")
                  for r in rows]
        lines.append("x copy: the recurrence step's time as a multiple of one copy of its state (read once, write "
                     "once: the least traffic a state update makes), paired per repetition in the same run")
    elif mode == "mixer":
        lines.append(f"{'B':>4}{'d_k':>5}{'pad':>5}{'ms':>10}{'speedup':>9}{'peak MiB':>10}{'peak ratio':>11}")
        lines += [f"{r['batch']:>4}{r['d_k']:>5}{r['d_k_padded']:>5}{r['ms']:>10.2f}{r['speedup']:>8.2f}x"
                  f"{r['peak_bytes'] / 2**20:>10.1f}{r['peak_ratio']:>10.2f}x" for r in rows]
    elif mode == "decode":
        lines.append(f"{'B':>4}{'d_k':>5}{'ms/token':>10}{'tokens/s':>10}{'speedup':>9}")
        lines += [f"{r['batch']:>4}{r['d_k']:>5}{r['ms_per_token']:>10.3f}{r['tokens_per_s']:>10.1f}{r['speedup']:>8.2f}x"
                  for r in rows]
    elif mode == "prefill":
        lines.append(f"{'B':>4}{'T':>7}{'d_k':>5}{'ms':>10}{'speedup':>9}")
        lines += [f"{r['batch']:>4}{r['seq_len']:>7}{r['d_k']:>5}{r['ms']:>10.2f}{r['speedup']:>8.2f}x" for r in rows]
        lines += [f"skipped {s['batch']}x{s['seq_len']}: {s['reason']}" for s in record["extra"]["skipped"]]
    elif mode == "state-memory":
        lines.append(f"{'model':<24}{'d_k':>5}{'kept':>5}{'bytes/seq':>14}{'relative':>9}{'max batch':>11}{'baseline':>9}")
        lines += [f"{r['model']:<24}{r['d_k']:>5}{r['kept']:>5}{r['state_bytes_per_sequence']:>14,}"
                  f"{r['relative_to_baseline']:>9.3f}{r.get('largest_batch', ''):>11}{r.get('largest_batch_baseline', ''):>9}"
                  for r in rows]
    return "\n".join(lines)


def _cmd_bench(args) -> int:
    torch.set_num_threads(args.threads)
    if args.mode == "calibration":
        return _cmd_calibration(args)
    if args.mode == "pipeline":
        return _cmd_pipeline(args)
    if args.mode == "selectors":
        return _cmd_selectors(args)
    ratios = tuple(args.ratios)
    if args.mode == "state-memory":
        record = _state_memory_record(args)
        tag = "all" if len(args.models) != 1 else _tag(args.models[0])
    elif args.mode == "recurrence":
        record = sb.bench_recurrence(device=args.device, batch=args.batch_sizes[0] if args.batch_sizes else 64,
                                     layers=args.layers or 2, ratios=ratios, protocol=_protocol(args),
                                     model_protocol=sb.TimingProtocol(args.warmup, max(1, args.steps // 10), args.repeats),
                                     levels=tuple(args.levels), malloc_heap=args.malloc_heap, profile=args.profile,
                                     kernel=args.kernel)
        tag = "gdn" + ("_heap" if args.malloc_heap else "") + ("" if args.kernel == "torch" else f"_{args.kernel}")
    elif args.mode == "mixer":
        record = sb.bench_mixer(device=args.device, batches=tuple(args.batch_sizes or (1, 2)), seq_len=args.seq_len or 512,
                                ratios=ratios, keeps=tuple(args.keep if args.keep is not None else (96, 80, 77)),
                                dtype=_dtype(args.dtype), protocol=_protocol(args), profile=args.profile)
        tag = "gdn"
    elif args.mode == "decode":
        record = sb.bench_decode(args.model, device=args.device, batches=tuple(args.batch_sizes or (1, 4, 16, 64)),
                                 prompt_len=args.prompt_len, ratios=ratios, keeps=tuple(args.keep or ()),
                                 layers=args.layers, dtype=_dtype(args.dtype), cuda_graphs=args.cuda_graphs,
                                 protocol=_protocol(args), profile=args.profile)
        tag = _tag(args.model)
    else:
        record = sb.bench_prefill(args.model, device=args.device, grid=tuple(args.grid or ((1, 256), (4, 256), (1, 1024))),
                                  ratios=ratios, keeps=tuple(args.keep or ()), layers=args.layers,
                                  dtype=_dtype(args.dtype), protocol=_protocol(args), profile=args.profile,
                                  memory_budget=parse_bytes(args.memory_budget) if args.memory_budget else None)
        tag = _tag(args.model)
    print(format_rows(record))
    path = write_result(_out_path(args, record, tag), record)
    print(f"-> {path}")
    return 0


def _state_memory_record(args) -> dict:
    t0 = time.perf_counter()
    register_auto_classes()
    budget = parse_bytes(args.budget) if args.budget else None
    fixed = parse_bytes(args.fixed) if args.fixed else 0
    dtype = _dtype(args.dtype or "bfloat16")
    rows = []
    for name in args.models:
        if name in PRESETS:
            family, kwargs = PRESETS[name]
            config = build_config(family, **kwargs)
        elif Path(name).is_dir():
            config = AutoConfig.from_pretrained(name)
        else:
            raise MissingInputError(f"model {name!r} is neither a preset ({', '.join(PRESETS)}) nor a checkpoint directory")

        K = get_adapter(config).key_heads(config)[1]
        keeps = tuple(k for k in args.keep or () if k <= K)  # with several models, a budget above one's d_k does not apply to it
        for row in state_memory_rows(config, ratios=(0.0, *args.ratios), keeps=keeps,
                                     budget_bytes=budget, fixed_bytes=fixed, dtype=dtype):
            rows.append({"model": _tag(name), **row})
    metrics = {f"state_bytes_{r['model']}_k{r['kept']}": r["state_bytes_per_sequence"] for r in rows}
    metrics.update({f"largest_batch_{r['model']}_k{r['kept']}": r["largest_batch"] for r in rows if "largest_batch" in r})
    config = {"mode": "state-memory", "models": list(args.models), "ratios": list(args.ratios), "keeps": list(args.keep or ()),
                  "budget_bytes": budget, "fixed_bytes": fixed, "dtype": str(dtype).removeprefix("torch."), "device": "config"}
    return build_result("bench", profile=args.profile, experiment="speed", config=config, metrics=metrics,
                        wall_time_s=time.perf_counter() - t0,
                        extra={"mode": "state-memory", "hardware": "none (accounting)", "backend": "none", "rows": rows})


def _cmd_pipeline(args) -> int:
    from state_reduction.results import results_dir, write_result
    from state_reduction.speed.cell_profile import bench_pipeline, format_pipeline

    record = bench_pipeline(args.experiment or "deltanet_gdn", args.cell_model, args.method, args.ratios[0], profile=args.profile,
                            limit=args.limit)
    print(format_pipeline(record))
    out = Path(args.out) if args.out else (results_dir(args.profile, "speed", args.results_root)
                                           / f"pipeline_{args.cell_model}_{args.method}_cpu.json")
    print(f"-> {write_result(out, record)}")
    return 0


def _cmd_calibration(args) -> int:
    rows = bench_calibration(args.model, sizes=args.sizes, seq_len=args.seq_len or 256, batch_size=args.batch_size,
                             corpus=args.calib)
    print(f"calibration + DRRQR (50%), {args.model}, {args.calib} calibration stream, seq_len {args.seq_len or 256}, "
          f"batch {args.batch_size}, CPU, 1 thread")
    print(format_calibration(rows))
    if args.out:
        write_json_atomic(args.out, {"kind": "bench", "mode": "calibration", "model": args.model, "rows": rows,
                                     "provenance": collect_provenance()})
    return 0


def _cmd_selectors(args) -> int:
    experiment = args.experiment or "selector_benchmark"
    record = bench_selectors(experiment=experiment, table=args.table or experiment, profile=args.profile,
                             methods=args.methods, models=args.cell_models, threads=args.threads,
                             progress=lambda r: print(f"  {r['model']} {r['method']}: {r['status']}", flush=True))
    print(f"selection cost, {record['config']['table']} of {experiment} ({args.profile}), ratio {record['config']['ratio']}, "
          f"one fresh prune process per cell, {args.threads} thread(s)")
    print(format_selectors(record))
    out = Path(args.out) if args.out else Path(args.results_root) / args.profile / experiment / "selector_cost.json"
    print(f"-> {write_result(out, record)}")
    if args.markdown:
        write_text_atomic(Path(args.markdown), selectors_markdown(record))
        print(f"-> {args.markdown}")
    return 0


def register(sub) -> None:
    be = sub.add_parser("bench", help="benchmarks printing ratios measured side by side in one run",
                        description="decode/prefill: full model (Tables 17, 18); mixer: one Gated DeltaNet layer "
                                    "(Table 19); recurrence: one decode step at recurrence, layer and model level with "
                                    "Amdahl bounds; state-memory: state bytes per sequence and the largest batch in a "
                                    "budget; calibration: time and peak memory vs calibration size; pipeline: the "
                                    "wall time of each stage of one table cell and the evaluation against the bare "
                                    "forward over the same batches.")
    be.add_argument("mode", choices=MODES)
    be.add_argument("--model", default=None, help=f"decode/prefill: checkpoint directory or preset (gdn-1.3b, dn-1.3b); default {DEFAULT_MODEL}; "
                         "recurrence always uses the gdn-1.3b shape")
    be.add_argument("--models", nargs="+", default=None, help="state-memory: several checkpoints or presets")
    be.add_argument("--device", default="cpu")
    be.add_argument("--ratios", type=float, nargs="+", default=[0.5, 0.75], help="fractions of key channels removed")
    be.add_argument("--keep", type=positive_int, nargs="*", default=None, help="extra explicit kept-channel budgets (e.g. 77)")
    be.add_argument("--batch-sizes", type=positive_int, nargs="+", default=None,
                    help="decode (default 1 4 16 64), mixer (default 1 2); recurrence: the first (default 64)")
    be.add_argument("--grid", type=_grid, nargs="+", default=None, help="prefill cells BxT, e.g. 1x2k 4x8k")
    be.add_argument("--prompt-len", type=positive_int, default=512)
    be.add_argument("--seq-len", type=length_int, default=None, help="mixer: T (paper 2048); calibration: window length")
    be.add_argument("--layers", type=positive_int, default=None,
                    help="presets: number of layers, keeping the 1.3B shapes (recurrence default 2)")
    be.add_argument("--dtype", default=None, help="bfloat16, float16 or float32 (default: bf16 on CUDA, fp32 on CPU)")
    be.add_argument("--cuda-graphs", choices=["auto", "on", "off"], default="auto", help="decode: capture steps in CUDA graphs")
    be.add_argument("--warmup", type=nonnegative_int, default=2, help="warm-up steps per repetition (paper 10)")
    be.add_argument("--steps", type=positive_int, default=5, help="measured steps per repetition (paper 100)")
    be.add_argument("--repeats", type=positive_int, default=3, help="repetitions; the median is reported (paper 3)")
    be.add_argument("--levels", nargs="+", default=["recurrence", "layer", "model"],
                    help="recurrence: what to time (recurrence alone, one mixer layer, the model)")
    be.add_argument("--malloc-heap", action="store_true",
                    help="recurrence on CPU: large blocks from the heap, not a fresh mmap per state tensor (glibc)")
    be.add_argument("--kernel", choices=["torch", "fused"], default="torch",
                    help="recurrence on CPU: the decode step timed: the torch reference, or the fused one-pass C step "
                         "(backend/fused_cpu.py; what STATE_REDUCTION_CPU_RECURRENCE=fused selects in every command)")
    be.add_argument("--memory-budget", default=None, help="prefill: skip cells estimated above this (default: free memory)")
    be.add_argument("--budget", default=None, help="state-memory: memory for recurrent states, e.g. 80GiB")
    be.add_argument("--fixed", default=None, help="state-memory: bytes taken before states (e.g. weights), e.g. 2.6GiB")
    be.add_argument("--threads", type=positive_int, default=1, help="torch threads")
    be.add_argument("--profile", choices=["tiny", "paper"], default="tiny")
    be.add_argument("--results-root", default=str(REPO_ROOT / "results"))
    be.add_argument("--out", default=None, help="result JSON (default results/<profile>/speed/<mode>_<model>_<device>.json)")
    be.add_argument("--sizes", type=int, nargs="+", default=[8, 32, 128, 512], help="calibration: numbers of sequences")
    be.add_argument("--batch-size", type=positive_int, default=8, help="calibration batch")
    be.add_argument("--calib", default="books", help="calibration corpus (books has the most calibration tokens)")
    be.add_argument("--experiment", default=None, help="pipeline: the experiment whose cell is timed (default "
                    "deltanet_gdn); selectors: the experiment whose table is costed (default selector_benchmark)")
    be.add_argument("--table", default=None, help="selectors: the table whose models and selectors are costed "
                    "(default: the table named as the experiment)")
    be.add_argument("--methods", nargs="+", default=None, help="selectors: a subset of the table's selectors")
    be.add_argument("--cell-models", nargs="+", default=None, help="selectors: a subset of the table's model keys")
    be.add_argument("--markdown", default=None, help="selectors: also write the cost table as Markdown here")
    be.add_argument("--cell-model", default="deltanet", help="pipeline: the cell's model key in the experiment")
    be.add_argument("--method", default="drrqr", help="pipeline: the cell's selector (first of --ratios is its ratio)")
    be.add_argument("--limit", type=float, default=None,
                    help="pipeline: examples per evaluation task (default: the experiment's)")
    be.set_defaults(func=_run, allocator="own")  # glibc's default, or --malloc-heap (allocator.heap_only)


def _run(args) -> int:
    if args.model is None:
        args.model = DEFAULT_MODEL if args.mode != "calibration" else str(TINY_CHECKPOINTS / "deltanet")
    if args.models is None:
        args.models = [args.model]
    try:
        return _cmd_bench(args)
    except BenchError as e:
        print(f"state-reduction bench {args.mode}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    parser = argparse.ArgumentParser(prog="state-reduction")
    register(parser.add_subparsers(dest="command", required=True))
    a = parser.parse_args()
    sys.exit(a.func(a))
