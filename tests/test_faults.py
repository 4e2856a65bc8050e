"""Fault injection, table-driven: every bad input of issue 21 (damaged checkpoints, configs, selections, states,
unwritable outputs, out-of-range options) is one line on stderr naming the file or option, exit 2, no traceback,
and nothing written at --out. An unexpected exception still prints its traceback and exits 1."""

import json
import os
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import torch

from state_reduction import atomic
from state_reduction.cli import main


@dataclass
class Case:
    name: str
    argv: Callable[[dict], list[str]]  # from the workspace paths
    expect: tuple[str, ...]  # substrings of the one error line
    damage: Callable[[dict], None] = lambda w: None
    untouched: Callable[[dict], list[Path]] = field(default=lambda w: [w["out"]])  # must not exist afterwards


def _copy(w, key="bad"):
    shutil.copytree(w["model"], w[key])
    return w[key]


def nan_embedding(w):
    from safetensors.torch import load_file, save_file

    folder = _copy(w)
    tensors = load_file(folder / "model.safetensors")
    name = next(k for k in tensors if "embeddings" in k)
    tensors[name][3, :5] = float("nan")  # data bytes only: the header stays intact
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def truncate_weights(w):
    f = _copy(w) / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def corrupt_header(w):
    f = _copy(w) / "model.safetensors"
    data = bytearray(f.read_bytes())
    (n,) = struct.unpack("<Q", data[:8])
    data[8:8 + n] = b"#" * n
    f.write_bytes(bytes(data))


def edit_config(edit):
    def damage(w):
        cfg = _copy(w) / "config.json"
        text = cfg.read_text()
        if edit == "truncate":
            cfg.write_text(text[: len(text) // 2])
            return
        d = json.loads(text)
        edit(d)
        cfg.write_text(json.dumps(d))
    return damage


def remove_tokenizer(w):
    folder = _copy(w)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()


def edit_selection(edit):
    def damage(w):
        folder = Path(shutil.copytree(w["pruned"], w["tmp"] / "pruned_bad"))
        record = json.loads((folder / "selection.json").read_text())
        edit(record["selection"]["0"]["keep"])
        (folder / "selection.json").write_text(json.dumps(record))
    return damage


def bad_state(kind):
    def damage(w):
        run = Path(shutil.copytree(w["rft_run"], w["tmp"] / "rft_bad"))
        state = run / "checkpoints" / "state.pt"
        if kind == "truncated":
            state.write_bytes(state.read_bytes()[: state.stat().st_size // 3])
        elif kind == "random":
            state.write_bytes(os.urandom(4096))
        elif kind == "empty":
            state.write_bytes(b"")
        elif kind == "foreign":
            torch.save({"step": 3}, state)
    return damage


def out_file(w):
    w["out"].write_text("not a folder")


def out_under_file(w):
    (w["tmp"] / "afile").write_text("x")


def read_only(w):
    w["ro"].mkdir()
    os.chmod(w["ro"], 0o555)


PRUNE = ["--method", "l1", "--ratio", "0.5"]
RFT = ["--preset", "tiny", "--steps", "2", "--batch-size", "2", "--seq-len", "16", "--corpus", "ptb", "--threads", "1",
       "--wandb", "disabled", "--set", "progress=false"]

CASES = [
    # weights and configs
    Case("nan-weights", lambda w: ["prune", str(w["bad"]), *PRUNE, "--out", str(w["out"])],
         ("non-finite", "embeddings", "bad"), nan_embedding),
    Case("truncated-safetensors", lambda w: ["prune", str(w["bad"]), *PRUNE, "--out", str(w["out"])],
         ("model.safetensors", "damaged", "truncated"), truncate_weights),
    Case("corrupted-safetensors-header", lambda w: ["prune", str(w["bad"]), *PRUNE, "--out", str(w["out"])],
         ("model.safetensors", "damaged"), corrupt_header),
    Case("config-missing-model_type", lambda w: ["prune", str(w["bad"]), *PRUNE, "--out", str(w["out"])],
         ("config.json", "model_type"), edit_config(lambda d: d.pop("model_type"))),
    Case("config-missing-hidden_size", lambda w: ["prune", str(w["bad"]), *PRUNE, "--out", str(w["out"])],
         ("bad",), edit_config(lambda d: d.pop("hidden_size"))),
    Case("config-wrong-type", lambda w: ["prune", str(w["bad"]), *PRUNE, "--out", str(w["out"])],
         ("bad",), edit_config(lambda d: d.update(num_heads="two"))),
    Case("config-truncated", lambda w: ["prune", str(w["bad"]), *PRUNE, "--out", str(w["out"])],
         ("config.json", "not valid JSON"), edit_config("truncate")),
    Case("prune-missing-path", lambda w: ["prune", str(w["tmp"] / "no" / "such"), *PRUNE, "--out", str(w["out"])],
         ("does not exist",)),
    Case("evaluate-missing-path", lambda w: ["evaluate", str(w["tmp"] / "nothere"), "--suite", "tiny_ppl",
                                             "--out", str(w["out_json"])], ("does not exist",),
         untouched=lambda w: [w["out_json"]]),
    Case("evaluate-tokenizer-missing", lambda w: ["evaluate", str(w["bad"]), "--suite", "tiny_ppl",
                                                  "--out", str(w["out_json"])], ("tokenizer", "bad"),
         remove_tokenizer, untouched=lambda w: [w["out_json"]]),
    Case("rft-teacher-nan", lambda w: ["rft", str(w["pruned"]), "--teacher", str(w["bad"]), "--out", str(w["out"]), *RFT],
         ("teacher", "non-finite"), nan_embedding, untouched=lambda w: [w["out"] / "model"]),
    # outputs
    Case("out-is-a-file-with-overwrite", lambda w: ["prune", str(w["model"]), *PRUNE, "--out", str(w["out"]),
                                                    "--overwrite"], ("is a file, not a folder",), out_file,
         untouched=lambda w: []),
    Case("out-under-a-file", lambda w: ["prune", str(w["model"]), *PRUNE, "--out", str(w["tmp"] / "afile" / "o")],
         ("is a file, so no folder",), out_under_file, untouched=lambda w: []),
    Case("prune-out-read-only", lambda w: ["prune", str(w["model"]), *PRUNE, "--out", str(w["ro"] / "o")],
         ("cannot write",), read_only, untouched=lambda w: [w["ro"] / "o"]),
    Case("evaluate-out-read-only", lambda w: ["evaluate", str(w["model"]), "--suite", "tiny_ppl",
                                              "--out", str(w["ro"] / "r.json")],
         ("cannot write",), read_only, untouched=lambda w: [w["ro"] / "r.json"]),
    Case("rft-out-under-a-file", lambda w: ["rft", str(w["pruned"]), "--teacher", str(w["model"]),
                                            "--out", str(w["tmp"] / "afile" / "run"), *RFT],
         ("is a file, so no folder",), out_under_file, untouched=lambda w: []),
    Case("evaluate-out-not-a-result", lambda w: ["evaluate", str(w["model"]), "--suite", "tiny_ppl",
                                                 "--out", str(w["tmp"] / "notes.json")],
         ("not a result file",), lambda w: (w["tmp"] / "notes.json").write_text("my notes"), untouched=lambda w: []),
    # numeric options and context lengths
    Case("prune-batch-size-0", lambda w: ["prune", str(w["model"]), *PRUNE, "--batch-size", "0", "--out", str(w["out"])],
         ("--batch-size", ">= 1")),
    Case("prune-n-calib-negative", lambda w: ["prune", str(w["model"]), *PRUNE, "--n-calib", "-3", "--out", str(w["out"])],
         ("--n-calib",)),
    Case("prune-ratio-1", lambda w: ["prune", str(w["model"]), "--method", "l1", "--ratio", "1", "--out", str(w["out"])],
         ("--ratio", "[0, 1)")),
    Case("evaluate-batch-size-0", lambda w: ["evaluate", str(w["model"]), "--batch-size", "0", "--out", str(w["out_json"])],
         ("--batch-size",), untouched=lambda w: [w["out_json"]]),
    Case("rft-lr-text", lambda w: ["rft", str(w["pruned"]), "--teacher", str(w["model"]), "--out", str(w["out"]),
                                   "--lr", "fast"], ("--lr", "a number")),
    Case("prune-seq-len-100000", lambda w: ["prune", str(w["model"]), "--method", "wanda", "--ratio", "0.5",
                                            "--seq-len", "100000", "--out", str(w["out"])],
         ("--seq-len 100000", "training length 64")),
    Case("evaluate-max-length-100000", lambda w: ["evaluate", str(w["model"]), "--suite", "tiny_ppl", "--max-length",
                                                  "100000", "--out", str(w["out_json"])],
         ("--max-length 100000", "training length 64"), untouched=lambda w: [w["out_json"]]),
    # what already held before issue 21 stays so
    Case("prune-method-typo", lambda w: ["prune", str(w["model"]), "--method", "drqr", "--ratio", "0.5",
                                         "--out", str(w["out"])], ("did you mean 'drrqr'",)),
    Case("prune-unknown-corpus", lambda w: ["prune", str(w["model"]), "--method", "wanda", "--ratio", "0.5",
                                            "--calib", "nocorpus", "--n-calib", "1", "--seq-len", "16",
                                            "--out", str(w["out"])], ("nocorpus",)),
    Case("evaluate-unknown-suite", lambda w: ["evaluate", str(w["model"]), "--suite", "tinny", "--out",
                                              str(w["out_json"])], ("tinny",), untouched=lambda w: [w["out_json"]]),
    Case("rft-without-teacher-choice", lambda w: ["rft", str(w["pruned"]), "--out", str(w["out"]), *RFT],
         ("--teacher", "--no-teacher")),
    # selections read by analyze
    *[Case(f"selection-{name}", lambda w: ["analyze", str(w["model"]), "--selection", str(w["tmp"] / "pruned_bad"),
                                           "--n-calib", "1", "--seq-len", "16", "--out", str(w["out_json"])],
           ("selection.json", "layer 0", *expect), edit_selection(edit), untouched=lambda w: [w["out_json"]])
      for name, edit, expect in [
          ("duplicate", lambda k: k[1].__setitem__(1, k[1][0]), ("head 1", "more than once")),
          ("non-integer", lambda k: k[0].__setitem__(0, 0.5), ("head 0", "0.5", "not an integer")),
          ("negative", lambda k: k[0].__setitem__(0, -1), ("head 0", "outside [0, 16)")),
          ("too-large", lambda k: k[0].__setitem__(-1, 16), ("head 0", "outside [0, 16)")),
          ("ragged", lambda k: k[1].pop(), ("head 1", "ragged")),
          ("unsorted", lambda k: k[0].reverse(), ("head 0", "not sorted")),
          ("missing-head", lambda k: k.pop(), ("one list per key head",)),
      ]],
    # RFT checkpoints
    *[Case(f"rft-resume-{kind}-state", lambda w: ["rft", str(w["pruned"]), "--teacher", str(w["model"]),
                                                   "--out", str(w["tmp"] / "rft_bad"), *RFT, "--resume"],
           ("state.pt", "--overwrite"), bad_state(kind), untouched=lambda w: [w["tmp"] / "rft_bad" / "model"])
      for kind in ("truncated", "random", "empty", "foreign")],
]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tiny_checkpoint):
    """A pruned copy of the tiny model and an RFT run stopped after its first checkpoint, shared by the cases."""
    from state_reduction.rft import RFTConfig, run_rft

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("faults")
    assert main(["prune", str(tiny_checkpoint), *PRUNE, "--out", str(root / "pruned")]) == 0
    cfg = RFTConfig.tiny_preset(str(root / "pruned"), str(tiny_checkpoint), str(root / "rft_run"), steps=4,
                                batch_size=2, seq_len=16, save_every=1, corpora=["ptb"], progress=False, threads=1,
                                wandb="disabled")
    assert run_rft(cfg, stop_after=1) == {"stopped_at": 0} or (root / "rft_run" / "checkpoints" / "state.pt").is_file()
    return {"model": tiny_checkpoint, "pruned": root / "pruned", "rft_run": root / "rft_run"}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fault_is_one_line_and_exit_2(case, workspace, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    w = {**workspace, "tmp": tmp_path, "bad": tmp_path / "bad", "out": tmp_path / "out",
         "out_json": tmp_path / "out.json", "ro": tmp_path / "ro"}
    case.damage(w)
    if case.damage is read_only and os.geteuid() == 0:  # root writes through mode 0555: refuse as the kernel would
        real = atomic._cannot_write
        monkeypatch.setattr(atomic, "_cannot_write",
                            lambda folder: "Permission denied" if Path(folder) == w["ro"] else real(folder))
    try:
        rc = main(case.argv(w))
    except SystemExit as e:  # argparse usage errors
        rc = e.code
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "error" in ln.lower()]  # progress bars and warnings aside
    assert rc == 2, err
    assert "Traceback" not in err
    assert len(lines) == 1 and err.rstrip().endswith(lines[0]), err
    print(f"{case.name}: {lines[0]}")  # -rP lists each case's message
    for text in case.expect:
        assert text in lines[0], (text, lines[0])
    for path in case.untouched(w):
        assert not path.exists(), f"{path} was written"


def _run_cli(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


@pytest.mark.slow  # a fresh interpreter imports torch and transformers: 5-45 s depending on the machine's load
def test_console_expected_failure_is_one_line_exit_2(tmp_path):
    proc = _run_cli("import sys; from state_reduction.cli import main; "
                    f"sys.exit(main(['prune', {str(tmp_path / 'none')!r}, '--method', 'l1', '--ratio', '0.5', "
                    f"'--out', {str(tmp_path / 'o')!r}]))")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.slow
def test_console_unexpected_exception_keeps_its_traceback_exit_1():
    proc = _run_cli("import sys, state_reduction.cli as c; c._cmd_data = lambda args: 1 / 0; sys.exit(c.main(['data']))")
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "ZeroDivisionError" in proc.stderr
