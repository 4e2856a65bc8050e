import json
from pathlib import Path

import pytest
import torch

from state_reduction.results import read_result
from state_reduction.rft import RFTError, run_rft
from state_reduction.rft import trainer as rft_trainer
from state_reduction.rft.trainer import (
    STATE_FILE,
    build_student,
    load_causal_lm,
    load_trainable_state,
)


def _state(out):
    return torch.load(out / STATE_FILE, weights_only=False)


def test_resume_after_a_stop_is_bit_exact(tmp_path, pruned_deltanet, dense_deltanet, small_config):
    straight = run_rft(small_config(pruned_deltanet, dense_deltanet, tmp_path / "straight"))
    cfg = small_config(pruned_deltanet, dense_deltanet, tmp_path / "killed")
    # step 3 runs but is lost (checkpoint every 2 steps), as with a kill between checkpoints
    assert run_rft(cfg, stop_after=3) == {"stopped_at": 3}
    assert _state(tmp_path / "killed")["step"] == 2
    cfg.resume = True
    resumed = run_rft(cfg)
    a, b = _state(tmp_path / "straight"), _state(tmp_path / "killed")
    assert a["step"] == b["step"] == 4
    assert a["trainable"].keys() == b["trainable"].keys()
    assert all(torch.equal(a["trainable"][k], b["trainable"][k]) for k in a["trainable"])
    assert [r["loss"] for r in a["history"]] == [r["loss"] for r in b["history"]]
    assert straight["metrics"]["final_loss"] == resumed["metrics"]["final_loss"]
    assert straight["model"]["weights_sha256"] == resumed["model"]["weights_sha256"]
    logged = [json.loads(line)["step"] for line in (tmp_path / "killed" / "log.jsonl").read_text().splitlines()]
    assert logged == [1, 2, 3, 4]


@pytest.fixture(scope="module")
def merged_run(tmp_path_factory, pruned_deltanet, dense_deltanet, small_config):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("merge") / "run"
    cfg = small_config(pruned_deltanet, dense_deltanet, out, steps=3, rank=4, alpha=24.0, lr=1e-2)
    return cfg, run_rft(cfg)


def test_merged_checkpoint_equals_the_unmerged_lora_model(merged_run, pruned_deltanet, small_config):
    from transformers import AutoModelForCausalLM

    cfg, _ = merged_run
    out = cfg.out
    peft_model = build_student(load_causal_lm(pruned_deltanet, "student"), cfg)
    load_trainable_state(peft_model, _state(Path(out))["trainable"])
    lora_b = [p for n, p in peft_model.named_parameters() if "lora_B" in n]
    assert any(p.abs().max() > 0 for p in lora_b)  # the adapters moved, so the merge is not trivial
    assert peft_model.peft_config["default"].r == 4 and peft_model.peft_config["default"].lora_alpha == 24.0
    merged = AutoModelForCausalLM.from_pretrained(f"{out}/model")  # stock loader
    x = torch.randint(0, merged.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    peft_model.eval()
    merged.eval()
    with torch.no_grad():
        ref, got = peft_model(input_ids=x).logits, merged(input_ids=x).logits
    assert torch.allclose(ref, got, atol=1e-5, rtol=1e-5), (ref - got).abs().max()
    student = AutoModelForCausalLM.from_pretrained(pruned_deltanet)
    assert merged.config.expand_k == student.config.expand_k
    assert merged.model.layers[0].attn.k_proj.weight.shape == student.model.layers[0].attn.k_proj.weight.shape
    assert not any("lora" in n for n, _ in merged.named_parameters())


def test_result_record_has_the_schema_and_metrics(merged_run, small_config):
    cfg, record = merged_run
    on_disk = read_result(f"{cfg.out}/rft_result.json")
    assert on_disk["kind"] == "rft" and on_disk["config_key"] == record["config_key"]
    m = on_disk["metrics"]
    for key in ("final_loss", "final_ce", "final_kl", "tokens", "tokens_per_s", "wall_time_s"):
        assert m[key] is not None and m[key] >= 0
    assert m["tokens"] == 3 * 4 * 32 and on_disk["config"]["rank"] == 4
    assert on_disk["extra"]["lora_parameters"] > 0


def test_resume_of_a_finished_run_returns_its_record(merged_run, small_config):
    cfg, record = merged_run
    cfg.resume = True
    try:
        again = run_rft(cfg)
    finally:
        cfg.resume = False
    assert again["created"] == record["created"]


def test_resume_with_another_config_is_refused_with_the_difference(merged_run, small_config):
    cfg, _ = merged_run
    other = small_config(cfg.student, cfg.teacher, cfg.out, steps=3, rank=4, alpha=24.0, lr=5e-3, resume=True)
    (Path(cfg.out) / "rft_result.json").rename(f"{cfg.out}/rft_result.moved")
    try:
        with pytest.raises(RFTError, match=r"another RFT config.*lr: 0\.01 -> 0\.005"):
            run_rft(other)
    finally:
        (Path(cfg.out) / "rft_result.moved").rename(f"{cfg.out}/rft_result.json")


def test_existing_run_needs_resume_or_overwrite(merged_run, small_config):
    cfg, _ = merged_run
    again = small_config(cfg.student, cfg.teacher, cfg.out, steps=3, rank=4, alpha=24.0, lr=1e-2)
    with pytest.raises(RFTError, match="pass resume"):
        run_rft(again)


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, pruned_deltanet, dense_deltanet, monkeypatch, small_config):
    real = rft_trainer.distillation_loss
    calls = {"n": 0}

    def nan_at_step_3(*args):
        calls["n"] += 1
        loss, ce, kl = real(*args)
        return (loss * float("nan"), ce, kl) if calls["n"] == 3 else (loss, ce, kl)

    monkeypatch.setattr(rft_trainer, "distillation_loss", nan_at_step_3)
    with pytest.raises(RFTError, match=r"non-finite loss \(nan\) at step 3.*last good checkpoint: step 2"):
        run_rft(small_config(pruned_deltanet, dense_deltanet, tmp_path / "nan"))
    assert _state(tmp_path / "nan")["step"] == 2
    assert not (tmp_path / "nan" / "model").exists()


def test_teacher_of_another_family_is_refused(tmp_path, pruned_deltanet, small_config, checkpoints):
    with pytest.raises(RFTError, match="teacher .* is 'gated_deltanet' but student .* is 'delta_net'"):
        run_rft(small_config(pruned_deltanet, str(checkpoints / "gated_deltanet"), tmp_path / "x"))


def test_teacher_with_another_vocabulary_is_refused(tmp_path, pruned_deltanet, dense_deltanet, small_config):
    teacher = load_causal_lm(dense_deltanet, "teacher")
    teacher.resize_token_embeddings(teacher.config.vocab_size + 8)
    teacher.save_pretrained(tmp_path / "bigger_vocab")
    with pytest.raises(RFTError, match="vocab_size 8200, student .* has 8192"):
        run_rft(small_config(pruned_deltanet, str(tmp_path / "bigger_vocab"), tmp_path / "x"))


def test_wandb_offline_run_dir_is_written(tmp_path, pruned_deltanet, monkeypatch, small_config):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    (tmp_path / "wb").mkdir()
    record = run_rft(small_config(pruned_deltanet, None, tmp_path / "run", steps=1, save_every=1))
    runs = list((tmp_path / "wb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and record["extra"]["wandb_dir"].startswith(str(runs[0]))
    assert record["metrics"]["final_kl"] == 0


def test_cli_bad_input_is_one_line_and_exit_code_2(tmp_path, pruned_deltanet, checkpoints, capsys):
    from state_reduction.cli import main

    rc = main(["rft", pruned_deltanet, "--teacher", str(checkpoints / "mamba2"), "--out", str(tmp_path / "x"),
               "--preset", "tiny", "--set", "progress=false"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("state-reduction")]
    assert rc == 2 and len(err) == 1 and err[0].startswith("state-reduction rft: error: teacher")
    rc = main(["rft", pruned_deltanet, "--no-teacher", "--out", str(tmp_path / "y"), "--preset", "tiny",
               "--set", "lora_targets=[q_conv1d]", "--set", "progress=false"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and "ShortConvolution" in err[-1]


def test_cli_registers_rft_and_bench_rft():
    from state_reduction.cli import build_parser
    from state_reduction.rft.throughput import format_rft_bench

    args = build_parser().parse_args(["rft", "s", "--teacher", "t", "--out", "o", "--rank", "8", "--set", "kd_weight=0.5"])
    assert args.rank == 8 and args.overrides == ["kd_weight=0.5"]
    args = build_parser().parse_args(["bench-rft", "--families", "deltanet,mamba2"])
    assert args.families == ["deltanet", "mamba2"]
    row = {"family": "deltanet", "teacher": True, "tokens_per_s": 1000.0, "peak_rss_bytes": 2**29, "final_loss": 5.0,
           "step_s": 0.5, "bare_step_s": 0.4, "fraction_of_bare": 0.8}
    assert "deltanet" in format_rft_bench([row]) and "512.0" in format_rft_bench([row])
    assert "0.80" in format_rft_bench([row])


def test_bare_step_is_the_student_forward_backward_and_the_teacher_forward(tmp_path, pruned_deltanet, dense_deltanet,
                                                                          small_config, monkeypatch):
    """The RFT efficiency's denominator (issue 20 part 4) runs each model once per repetition (plus one warm-up) on
    batches of the run's shape, trains nothing, and leaves the run's own folder alone."""
    from state_reduction.rft.throughput import bare_step_seconds

    calls = []
    original = torch.nn.Module.__call__

    def spy(self, *args, **kwargs):
        if "input_ids" in kwargs and type(self).__name__.endswith("ForCausalLM"):
            calls.append((torch.is_grad_enabled(), tuple(kwargs["input_ids"].shape)))
        return original(self, *args, **kwargs)

    cfg = small_config(pruned_deltanet, dense_deltanet, str(tmp_path / "run"))
    monkeypatch.setattr(torch.nn.Module, "__call__", spy)
    seconds = bare_step_seconds(cfg, 2)
    monkeypatch.undo()
    assert len(seconds) == 2 and all(s > 0 for s in seconds)
    assert calls.count((False, (cfg.batch_size, cfg.seq_len))) == 3  # the teacher, no grad
    assert calls.count((True, (cfg.batch_size, cfg.seq_len))) == 3  # the student with LoRA
    assert not (tmp_path / "run").exists()


def test_micro_batches_accumulate_to_the_full_batch(tmp_path, pruned_deltanet, dense_deltanet, small_config):
    run_rft(small_config(pruned_deltanet, dense_deltanet, tmp_path / "full", steps=2, save_every=2))
    run_rft(small_config(pruned_deltanet, dense_deltanet, tmp_path / "micro", steps=2, save_every=2, micro_batch_size=2))
    a, b = _state(tmp_path / "full"), _state(tmp_path / "micro")
    for ra, rb in zip(a["history"], b["history"]):
        assert abs(ra["loss"] - rb["loss"]) <= 1e-5 * ra["loss"]
    assert max((a["trainable"][k] - b["trainable"][k]).abs().max().item() for k in a["trainable"]) <= 1e-5


def test_resume_with_no_steps_left_reports_the_runs_throughput(merged_run, tmp_path):
    """Killed after its last checkpoint, before the result: the resumed run trains no step, and its tokens/s is
    that of the steps it did train (issue 21: it was 0)."""
    import shutil

    cfg, record = merged_run
    run = tmp_path / "run"
    shutil.copytree(cfg.out, run)
    (run / "rft_result.json").unlink()
    again = run_rft(type(cfg)(**{**cfg.to_dict(), "adam_betas": tuple(cfg.adam_betas), "out": str(run), "resume": True}))
    assert again["metrics"]["steps"] == record["metrics"]["steps"]
    assert again["metrics"]["tokens_per_s"] > 0
    assert again["metrics"]["final_loss"] == record["metrics"]["final_loss"]


def test_bf16_checkpoint_trains_norms_and_biases_in_fp32(tmp_path, pruned_deltanet, dense_deltanet, small_config):
    """Issue 22: on a bf16 student, norm and bias updates of ~lr round away in bf16 (0 of 103,424 norm elements
    changed in 2 steps); fp32 master weights move every trainable norm. The merged model is saved in bf16."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from state_reduction.rft.targets import extra_trainable

    student = AutoModelForCausalLM.from_pretrained(pruned_deltanet).to(torch.bfloat16)
    bf16 = tmp_path / "student-bf16"
    student.save_pretrained(bf16)
    AutoTokenizer.from_pretrained(pruned_deltanet).save_pretrained(bf16)
    record = run_rft(small_config(str(bf16), dense_deltanet, tmp_path / "run", steps=2, save_every=2, lr=1e-4))
    assert record["extra"]["master_dtype"] == "float32" and record["extra"]["saved_dtype"] == "torch.bfloat16"
    trained = _state(tmp_path / "run")["trainable"]
    names = [n for n in trained if "norm" in n and "lora" not in n]
    assert names and all(trained[n].dtype == torch.float32 for n in names)
    before = dict(AutoModelForCausalLM.from_pretrained(str(bf16), dtype=torch.float32).named_parameters())
    moved = [n for n in names if not torch.equal(trained[n], before[n.removeprefix("base_model.model.")])]
    assert len(moved) == len(names), f"{len(names) - len(moved)} of {len(names)} norm tensors did not move"
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "run" / "model"))
    assert next(merged.parameters()).dtype == torch.bfloat16
    assert set(extra_trainable(merged, ["norm"]))


def test_unreachable_corpus_fails_before_any_model_loads(tmp_path, pruned_deltanet, dense_deltanet, small_config,
                                                         monkeypatch):
    loads = []
    monkeypatch.setattr(rft_trainer, "load_causal_lm", lambda *a, **k: loads.append(a) or None)
    with pytest.raises(Exception, match="no-such-corpus"):
        run_rft(small_config(pruned_deltanet, dense_deltanet, tmp_path / "run", corpora=["no-such-corpus"]))
    assert loads == []


def test_merge_needs_no_third_model_copy(tmp_path, pruned_deltanet, dense_deltanet, small_config, monkeypatch):
    """The final merge happens in place on the trained student after the teacher is freed: two loads in all."""
    loads = []
    real = rft_trainer.load_causal_lm
    monkeypatch.setattr(rft_trainer, "load_causal_lm", lambda path, what, **k: loads.append(what) or real(path, what, **k))
    run_rft(small_config(pruned_deltanet, dense_deltanet, tmp_path / "run", steps=1, save_every=1))
    assert loads == ["student", "teacher"]


def test_paper_recipe_micro_batches_by_default():
    from state_reduction.rft import RFTConfig

    paper = RFTConfig.from_preset("paper", "s", "t", "o")
    assert paper.micro_batch_size == 2 and paper.batch_size == 16 and paper.seq_len == 2048
    assert RFTConfig.from_preset("tiny", "s", "t", "o").micro_batch_size is None


def test_ce_weight_is_checked_and_keeps_earlier_keys():
    from state_reduction.rft import RFTConfig

    base = RFTConfig.tiny_preset("s", "t", "o")
    assert "ce_weight" not in base.identity()  # at 1.0: every RFT key made before the field existed is unchanged
    kd_only = RFTConfig.tiny_preset("s", "t", "o", ce_weight=0.0)
    assert kd_only.identity()["ce_weight"] == 0.0 and kd_only.hash() != base.hash()
    kd_only.validate()
    for bad, words in ((dict(ce_weight=-1.0), "ce_weight must be >= 0"),
                       (dict(ce_weight=0.0, kd_weight=0.0), "needs a teacher and kd_weight > 0")):
        with pytest.raises(RFTError, match=words):
            RFTConfig.tiny_preset("s", "t", "o", **bad).validate()
    with pytest.raises(RFTError, match="needs a teacher"):
        RFTConfig.tiny_preset("s", None, "o", ce_weight=0.0).validate()


def test_distillation_only_dense_model_moves_under_adam(tmp_path, dense_deltanet, small_config):
    """Distillation only (ce_weight 0) on the dense model: the loss and its gradient start at rounding level (the
    student is its teacher), yet AdamW (eps 1e-15) normalises that gradient into lr-sized steps, so one step moves the
    model: the dense model is a stationary point of the kd-only loss but not a fixed point of RFT (experiments/rft)."""
    from state_reduction.backend import install_cpu_backend
    from state_reduction.checkpoints import load_model

    install_cpu_backend()
    record = run_rft(small_config(dense_deltanet, dense_deltanet, tmp_path / "kd", ce_weight=0.0, steps=1,
                                  warmup_steps=0))
    log = [json.loads(line) for line in (tmp_path / "kd" / "log.jsonl").read_text().splitlines()]
    assert abs(log[0]["loss"]) < 1e-5, log[0]
    ids = torch.randint(0, 100, (1, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = load_model(dense_deltanet).eval()(input_ids=ids).logits
        after = load_model(record["model"]["path"]).eval()(input_ids=ids).logits
    assert (after - before).abs().max().item() > 1e-2
