"""Which modules RFT adapts and which parameters it trains: each family's `lora` (state_reduction.models.families).

LoRA goes on the q/k/v projections of the recurrent mixers (the modules the pruning adapter finds), so
hybrid models keep their softmax-attention layers frozen (Qwen3.5). Parameters whose name contains one of
`train_extra` (conv1d, norm, bias: authors' recipe) also train, anywhere in the model or only inside the
mixers (`extra_scope`)."""

from __future__ import annotations

import re

from torch import nn

from state_reduction.errors import UnknownNameError
from state_reduction.models.families import LoraTargets, family_for
from state_reduction.models.families import get_adapter
from state_reduction.rft.config import RFTError


def family_targets(model_type: str) -> LoraTargets:
    try:
        return family_for(model_type).lora
    except UnknownNameError as e:
        raise RFTError(f"no RFT target table: {e.args[0]}") from None


def mixer_names(model: nn.Module) -> list[str]:
    return [ref.name for ref in get_adapter(model).mixers(model)]


def resolve_lora_targets(model: nn.Module, patterns: list[str] | None) -> list[str]:
    """Full module names that get LoRA. `patterns` None: the family table; otherwise each pattern is a
    module name suffix (`q_proj`, `attn.k_proj`) or a regex fully matching full names. Every pattern must
    match, and every match must be a plain nn.Linear peft can wrap; errors name the module."""
    model_type = model.config.model_type
    table = family_targets(model_type)
    modules = dict(model.named_modules())
    if patterns is None:
        names = [f"{mixer}.{child}" for mixer in mixer_names(model) for child in table.lora]
        missing = [n for n in names if n not in modules]
        if missing:
            raise RFTError(f"{model_type}: LoRA target table names modules this model lacks: {', '.join(missing)}")
    else:
        names = []
        for pattern in patterns:
            found = [n for n in modules if n and (n == pattern or n.endswith("." + pattern) or _fullmatch(pattern, n))]
            if not found:
                raise RFTError(f"{model_type}: LoRA target {pattern!r} matches no module (q/k/v projections of this "
                               f"family: {', '.join(table.lora)})")
            names.extend(n for n in found if n not in names)
    for name in names:
        child = name.rsplit(".", 1)[-1]
        module = modules[name]
        if child in table.unwrappable:
            raise RFTError(f"{model_type}: LoRA target {name} ({type(module).__name__}) cannot be wrapped: "
                           f"{table.unwrappable[child]}")
        if type(module) is not nn.Linear:
            raise RFTError(f"{model_type}: LoRA target {name} is a {type(module).__module__}.{type(module).__name__}, "
                           "not a torch.nn.Linear; RFT puts LoRA on linear projections only")
    return names


def _fullmatch(pattern: str, name: str) -> bool:
    try:
        return re.fullmatch(pattern, name) is not None
    except re.error:
        return False


def extra_trainable(model: nn.Module, train_extra: list[str]) -> list[str]:
    """Names (in `model`'s own namespace) of the non-LoRA parameters that train."""
    table = family_targets(model.config.model_type)
    scopes = [m + "." for m in mixer_names(model)] if table.extra_scope == "mixers" else [""]
    return [n for n, _ in model.named_parameters()
            if any(s in n for s in train_extra) and any(n.startswith(sc) for sc in scopes)]
