"""`state-reduction prefetch`: everything a set of tables needs, fetched into one cache folder on a machine with
internet, so that compute nodes without any network run them with HF_HUB_OFFLINE=1 (issue 22).

An artefact is (kind, name): a `model` (hub id; local folders are the user's), a `corpus` (tiny: the verified
canonical text under the data folder; paper: the hub dataset), an `lm_eval_task` (the hub dataset lm-eval reads)
and the RULER haystack essays, which lm-eval downloads from GitHub at run time. `check_offline` finds, before
any compute, the first artefact missing from the cache and names it in one line; `run-table` calls it whenever
HF_HUB_OFFLINE is set.

Layout of the cache folder: `hf/` (HF_HOME: hub models and datasets), `data/` (STATE_REDUCTION_DATA: the tiny
corpora and their built evaluation suites), `ruler/` (the haystack essays).
"""

from __future__ import annotations

import json
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import snapshot_download

from state_reduction.atomic import write_bytes_atomic
from state_reduction.data import get_corpus_info, load_corpus
from state_reduction.data.fetch import canonical_path, resolve_data_dir, sha256_file
from state_reduction.errors import MissingInputError
from state_reduction.evaluation import longctx, tiny_suite
from state_reduction.evaluation.run import SUITES
from state_reduction.pipeline import (find_experiment, load_experiment, profile_spec, resolve_model_path, table_cells,
    table_evaluate)
from state_reduction.rft import RFTConfig

# lm-eval task -> hub dataset it reads (paper suites; evaluation.run.PAPER_METRICS / PAPER_LONGCTX)
LM_EVAL_DATASETS = {
    "arc_easy": ("allenai/ai2_arc", "ARC-Easy"), "arc_challenge": ("allenai/ai2_arc", "ARC-Challenge"),
    "hellaswag": ("Rowan/hellaswag", None), "piqa": ("baber/piqa", None),
    "winogrande": ("allenai/winogrande", "winogrande_xl"), "lambada_openai": ("EleutherAI/lambada_openai", "default"),
    "wikitext": ("EleutherAI/wikitext_document_level", "wikitext-2-raw-v1"),
    "squad_completion": ("hazyresearch/based-squad", None), "swde": ("hazyresearch/based-swde-v2", None),
    "c4": ("allenai/c4", "en"),
}
# the files a task reads where its dataset repository is far larger (lm-eval's c4 task: the first shard of each split)
LM_EVAL_FILES = {"c4": ["en/c4-train.00000-of-01024.json.gz", "en/c4-validation.00000-of-00008.json.gz"]}
# RULER's haystack: Paul Graham essays, fetched by lm-eval's ruler utilities from GitHub at run time
RULER_HAYSTACK_URL = "https://raw.githubusercontent.com/gkamradt/LLMTest_NeedleInAHaystack/main/needlehaystack/PaulGrahamEssays"


class OfflineError(MissingInputError):
    """An artefact a table needs is not in the offline cache; the message names it and how to fetch it."""


@dataclass(frozen=True)
class Artefact:
    kind: str  # model, corpus, lm_eval_task, ruler_haystack
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


def cache_env(cache: str | Path) -> dict[str, str]:
    """The environment that points every reader at `cache` (set it on the compute node too)."""
    cache = Path(cache).resolve()
    return {"HF_HOME": str(cache / "hf"), "HF_DATASETS_CACHE": str(cache / "hf" / "datasets"),
            "STATE_REDUCTION_DATA": str(cache / "data"), "STATE_REDUCTION_RULER": str(cache / "ruler")}


def needs(profile: str, tables: list[str], experiment: str | None = None) -> list[Artefact]:
    """Every artefact the tables need on `profile`, in a stable order, without duplicates."""
    out: list[Artefact] = []

    def add(kind, name):
        a = Artefact(kind, name)
        if a not in out:
            out.append(a)

    for table in tables:
        spec = load_experiment(experiment or find_experiment(table))
        p = profile_spec(spec, profile)
        keys, cells, rft_states = table_cells(spec, table, profile)
        for key in keys:
            path = p["models"][key]["path"]
            try:
                path = resolve_model_path(path)
            except Exception:  # noqa: BLE001  (an unset ${VAR}: a local checkpoint, not a hub id)
                continue
            if not Path(path).exists() and path.count("/") == 1:
                add("model", path)
        if cells:
            add("corpus", p["prune"]["calib"])
            for c in cells:
                for k, v in c.vary:
                    if k == "calib":
                        add("corpus", v)
        if True in rft_states:
            rft = p["rft"]
            cfg = RFTConfig.from_preset(rft["preset"], "s", "t", "o", **{k: v for k, v in rft.items() if k != "preset"})
            for corpus in cfg.corpora:
                add("corpus", corpus)
        suite = table_evaluate(spec, table, profile)[0]["suite"]
        for task in SUITES[suite]:
            if suite.startswith("paper"):
                add("lm_eval_task", task if task in LM_EVAL_DATASETS else "ruler")
            else:
                tasks = longctx.TASKS if suite == "tiny_longctx" else tiny_suite.TASKS
                for corpus in (getattr(tasks.get(task), "corpora", None) or longctx.CORPORA):
                    add("corpus", corpus)
        if suite == "paper_longctx":
            add("ruler_haystack", RULER_HAYSTACK_URL)
    for a in out:
        if a.kind == "corpus":
            get_corpus_info(a.name)  # an unknown corpus is an error here, not on the compute node
    return out


def _hub_cached(repo_id: str, repo_type: str, cache: Path) -> bool:
    root = cache / "hf" / "hub" / f"{repo_type}s--{repo_id.replace('/', '--')}"
    return (root / "snapshots").is_dir() and any((root / "snapshots").iterdir())


def present(a: Artefact, cache: Path) -> bool:
    cache = Path(cache)
    if a.kind == "model":
        return _hub_cached(a.name, "model", cache)
    if a.kind == "corpus":
        info = get_corpus_info(a.name)
        if info.profile == "paper":
            return _hub_cached(info.package, "dataset", cache)
        path = canonical_path(info, cache / "data")
        return path.is_file() and sha256_file(path) == info.sha256
    if a.kind == "lm_eval_task":
        return a.name != "ruler" and _hub_cached(LM_EVAL_DATASETS[a.name][0], "dataset", cache) or \
            (a.name == "ruler" and (cache / "ruler").is_dir())
    if a.kind == "ruler_haystack":
        return (cache / "ruler" / "essays").is_dir() and any((cache / "ruler" / "essays").iterdir())
    raise ValueError(f"prefetch: unknown artefact kind {a.kind!r}; kinds: model, corpus, lm_eval_task, ruler_haystack")


def check_offline(profile: str, tables: list[str], cache: str | Path, experiment: str | None = None) -> None:
    """Before any compute: every artefact of the tables is in `cache`, else OfflineError naming the first missing."""
    missing = [a for a in needs(profile, tables, experiment) if not present(a, Path(cache))]
    if missing:
        raise OfflineError(f"offline ({profile} profile, {', '.join(tables)}): {missing[0]} is not in the cache "
                           f"{cache}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
                           + f"; run `state-reduction prefetch --profile {profile} --tables {' '.join(tables)} "
                           f"--cache {cache}` where the network is reachable")


def fetch(a: Artefact, cache: Path) -> None:
    """Download one artefact into `cache` (needs the network)."""
    env = cache_env(cache)
    os.environ.update(env)
    if a.kind == "model":
        snapshot_download(a.name, cache_dir=Path(env["HF_HOME"]) / "hub")
    elif a.kind == "corpus":
        info = get_corpus_info(a.name)
        if info.profile == "paper":
            # the streamed corpora read a prefix of their shards; the snapshot holds every file of the config
            snapshot_download(info.package, repo_type="dataset", cache_dir=Path(env["HF_HOME"]) / "hub",
                              allow_patterns=[f"{info.version}/*", "*.json", "*.md"] if info.version else None)
        else:
            load_corpus(a.name, "train", data_dir=resolve_data_dir(env["STATE_REDUCTION_DATA"]))
    elif a.kind == "lm_eval_task":
        if a.name != "ruler":
            snapshot_download(LM_EVAL_DATASETS[a.name][0], repo_type="dataset", cache_dir=Path(env["HF_HOME"]) / "hub",
                              allow_patterns=LM_EVAL_FILES.get(a.name))
        else:
            (cache / "ruler").mkdir(parents=True, exist_ok=True)
    elif a.kind == "ruler_haystack":
        essays = cache / "ruler" / "essays"
        essays.mkdir(parents=True, exist_ok=True)
        index = urllib.request.urlopen(  # noqa: S310  (a fixed https URL)
            "https://api.github.com/repos/gkamradt/LLMTest_NeedleInAHaystack/contents/needlehaystack/PaulGrahamEssays",
            timeout=60).read()

        for entry in json.loads(index):
            write_bytes_atomic(essays / entry["name"],
                               urllib.request.urlopen(entry["download_url"], timeout=60).read())  # noqa: S310


def prefetch(profile: str, tables: list[str], cache: str | Path, experiment: str | None = None) -> list[Artefact]:
    cache = Path(cache)
    cache.mkdir(parents=True, exist_ok=True)
    got = []
    for a in needs(profile, tables, experiment):
        if not present(a, cache):
            print(f"prefetch: {a}", flush=True)
            fetch(a, cache)
        got.append(a)
    check_offline(profile, tables, cache, experiment)
    return got


def _cmd_prefetch(args) -> int:
    got = prefetch(args.profile, args.tables, args.cache, args.experiment)
    env = " ".join(f"{k}={v}" for k, v in cache_env(args.cache).items())
    print(f"prefetch: {len(got)} artefacts in {args.cache}. On the compute node: HF_HUB_OFFLINE=1 "
          f"HF_DATASETS_OFFLINE=1 {env} state-reduction run-table TABLE --profile {args.profile}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("prefetch", help="download every model, dataset, lm-eval task and RULER haystack the "
                                               "tables need into a cache folder (for compute nodes without network)")
    p.add_argument("--profile", choices=["tiny", "paper"], default="paper")
    p.add_argument("--tables", nargs="+", required=True, help="tables (table20, table1, ...)")
    p.add_argument("--experiment", default=None)
    p.add_argument("--cache", required=True, help="cache folder (copy it to the cluster's shared disk)")
    p.set_defaults(func=_cmd_prefetch)
