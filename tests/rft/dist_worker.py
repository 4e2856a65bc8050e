"""Run under `torchrun --nproc-per-node 2` by test_distributed.py: one process group (gloo), then
(1) DDP through the CLI entry point, (2) FSDP stopped after one step and resumed to the end."""

import sys

import torch
import torch.distributed as dist

from state_reduction.cli import main
from state_reduction.rft import RFTConfig, run_rft

student, teacher, root = sys.argv[1:4]
torch.set_num_threads(1)
dist.init_process_group("gloo")
common = ["--preset", "tiny", "--steps", "3", "--batch-size", "4", "--seq-len", "32", "--warmup-steps", "1",
          "--save-every", "1", "--corpus", "ptb", "--threads", "1", "--wandb", "disabled", "--set", "progress=false"]
rc = main(["rft", student, "--teacher", teacher, "--out", f"{root}/ddp", *common])
assert rc == 0, rc
cfg = RFTConfig.tiny_preset(student, teacher, f"{root}/fsdp", steps=3, batch_size=4, seq_len=32, warmup_steps=1,
                            save_every=1, corpora=["ptb"], threads=1, wandb="disabled", progress=False,
                            distributed="fsdp")
assert run_rft(cfg, stop_after=1) == {"stopped_at": 1}
cfg.resume = True
record = run_rft(cfg)
assert record["extra"]["distributed"] == "fsdp" and record["extra"]["world_size"] == 2
dist.destroy_process_group()
