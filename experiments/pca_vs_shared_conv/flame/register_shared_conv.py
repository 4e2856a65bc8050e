"""Passed to flame as `--experimental.custom_model_path`: registers model type delta_net_shared_conv with the Auto
classes (flame builds the model with AutoModelForCausalLM.from_config). Needs this repository's package installed."""

import state_reduction  # noqa: F401
