"""Which modules RFT adapts and which parameters it trains, one row per model family.

LoRA goes on the q/k/v projections of the recurrent mixers (the modules the pruning adapter finds), so
hybrid models keep their softmax-attention layers frozen (Qwen3.5). Parameters whose name contains one of
`train_extra` (conv1d, norm, bias: authors' recipe) also train, anywhere in the model or only inside the
mixers (`extra_scope`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import nn

from state_reduction.rft.config import RFTError


@dataclass(frozen=True)
class RFTTargets:
    lora: tuple[str, ...]  # child names of a mixer module that get LoRA
    extra_scope: str  # "model": train_extra matches anywhere; "mixers": only inside the recurrent mixers
    unwrappable: dict[str, str]  # child name -> why peft cannot wrap it


_FLA_CONV = {"q_conv1d": "fla ShortConvolution (depthwise conv returning (y, cache)) is not a LoRA target",
             "k_conv1d": "fla ShortConvolution (depthwise conv returning (y, cache)) is not a LoRA target",
             "v_conv1d": "fla ShortConvolution (depthwise conv returning (y, cache)) is not a LoRA target"}

TARGETS: dict[str, RFTTargets] = {
    "delta_net": RFTTargets(lora=("q_proj", "k_proj", "v_proj"), extra_scope="model", unwrappable=_FLA_CONV),
    "delta_net_shared_conv": RFTTargets(lora=("q_proj", "k_proj", "v_proj"), extra_scope="model",
                                        unwrappable=_FLA_CONV),
    "gated_deltanet": RFTTargets(lora=("q_proj", "k_proj", "v_proj"), extra_scope="model", unwrappable=_FLA_CONV),
    # in_proj holds [z | x | B | C | dt]: x, B, C are Mamba-2's v, k, q (appendix C.3); it is the only projection.
    "mamba2": RFTTargets(lora=("in_proj",), extra_scope="model", unwrappable={
        "out_proj": "peft refuses out_proj on Mamba models (model_type mamba2)",
        "conv1d": "peft refuses conv1d on Mamba models (model_type mamba2)"}),
    # in_proj_qkv rows [q | k | v]; attention layers (self_attn) and everything outside linear_attn stay frozen.
    "qwen3_5_text": RFTTargets(lora=("in_proj_qkv",), extra_scope="mixers", unwrappable={
        "conv1d": "the Qwen3.5 gated-delta conv1d is applied functionally (its forward is never called)"}),
}
# the same families with structures removed (state_reduction.models.shed): the remaining mixers are the same modules
TARGETS.update({f"{t}_shed": TARGETS[t] for t in ("delta_net", "gated_deltanet", "mamba2", "qwen3_5_text")})


# RaLiMP variants (models/ralimp_variant.py): the family's LoRA targets; the replaced MLPs train in full through
# train_extra (e.g. "mlp.gated"), which must reach outside the mixers, hence extra_scope "model".
def _linearized_variants() -> None:
    from state_reduction.models.ralimp_variant import VARIANTS

    for base, (config_cls, _) in VARIANTS.items():
        t = TARGETS[base]
        TARGETS[config_cls.model_type] = RFTTargets(lora=t.lora, extra_scope="model", unwrappable=t.unwrappable)


_linearized_variants()


def family_targets(model_type: str) -> RFTTargets:
    if model_type not in TARGETS:
        import difflib

        close = difflib.get_close_matches(str(model_type), list(TARGETS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise RFTError(f"no RFT target table for model_type {model_type!r}{hint} (supported: {', '.join(TARGETS)})")
    return TARGETS[model_type]


def mixer_names(model: nn.Module) -> list[str]:
    from state_reduction.pruning.adapters import get_adapter

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
