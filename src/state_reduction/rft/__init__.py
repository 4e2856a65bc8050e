"""Recovery fine-tuning (RFT): LoRA + distillation from the dense teacher, resumable, DDP/FSDP."""

from state_reduction.rft.config import PRESETS, RFTConfig, RFTError
from state_reduction.rft.trainer import distillation_loss, run_rft

__all__ = ["PRESETS", "RFTConfig", "RFTError", "distillation_loss", "run_rft"]
