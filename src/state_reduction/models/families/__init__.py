"""The model families, one module each, and the registry derived from their `ModelFamily` objects.

Every other module asks the registry: `get_family(name)` by canonical name (or a checkpoint's model_type, an
alias), `family_for(model_or_config)` by `config.model_type` (stock models and their derived `_shed` / `_ralimp`
variants). Adding a family = one module here declaring `FAMILY` plus `register_family(FAMILY)` (the stock
families below are registered on import); README "Extending: a model family".
"""

from __future__ import annotations

import dataclasses
import difflib
import warnings

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from state_reduction.errors import InputError, UnknownNameError
from state_reduction.models.families import deltanet, deltanet_shared_conv, gated_deltanet, mamba2, qwen3_5
from state_reduction.models.families.base import (
    Architecture,
    KernelInputs,
    KernelRoute,
    LoraTargets,
    MixerHooks,
    ModelFamily,
)
from state_reduction.models.kdim_variant import KDIM_SUFFIX, make_kdim_variant
from state_reduction.models.ralimp_variant import RALIMP_SUFFIX, make_ralimp_variant
from state_reduction.models.shed import SHED_SUFFIX, make_shed_variant
from state_reduction.pruning.adapters import kdim_variant, ralimp_variant, shed_variant

FAMILIES: dict[str, ModelFamily] = {}  # canonical name -> stock family
MODEL_TYPES: dict[str, ModelFamily] = {}  # config.model_type -> stock family or derived variant
_auto_registered: set[str] = set()  # model types registered with the Auto classes


def _derived(family: ModelFamily) -> list[ModelFamily]:
    """The structure-removal, RaLiMP and per-layer key-dim variants of a stock family: other config/model classes
    and model_type, the same mixers (adapter, kernel route); a shed variant counts the state of its remaining mixers
    only, a RaLiMP variant trains its replaced MLPs outside the mixers (LoRA extra_scope "model"), and a kdim
    variant counts each layer's state at its own K'."""
    out = []
    common = {"base": family.name, "flame": False, "check_config": None, "presets": {}, "architectures": (),
              "tiny_checkpoints": (), "recall_checkpoints": (), "wrapper_model_types": (), "shed": False,
              "ralimp": False, "kdim": False, "register": None}
    if family.shed:
        config_cls, model_cls = make_shed_variant(family.config_class, family.model_class,
                                                  family.model_type + SHED_SUFFIX, family.adapter.structure)
        out.append(dataclasses.replace(family, **common, name=family.name + SHED_SUFFIX, variant="shed",
                                       model_type=config_cls.model_type, config_class=config_cls,
                                       model_class=model_cls, adapter=shed_variant(family.adapter)))
    if family.ralimp:
        config_cls, model_cls = make_ralimp_variant(family.config_class, family.model_class,
                                                    family.model_type + RALIMP_SUFFIX)
        lora = dataclasses.replace(family.lora, extra_scope="model")
        out.append(dataclasses.replace(family, **common, name=family.name + RALIMP_SUFFIX, variant="ralimp",
                                       model_type=config_cls.model_type, config_class=config_cls,
                                       model_class=model_cls, lora=lora,
                                       adapter=ralimp_variant(family.adapter, config_cls.model_type)))
    if family.kdim:
        config_cls, model_cls = make_kdim_variant(family.config_class, family.model_class,
                                                  family.model_type + KDIM_SUFFIX, family.adapter)
        out.append(dataclasses.replace(family, **common, name=family.name + KDIM_SUFFIX, variant="kdim",
                                       model_type=config_cls.model_type, config_class=config_cls,
                                       model_class=model_cls,
                                       adapter=kdim_variant(family.adapter, config_cls.model_type)))
    return out


def register_family(family: ModelFamily) -> ModelFamily:
    """Add a stock family and its derived variants to the registry (and to the Auto classes, if the package has
    registered them already); a name or model_type taken by another family is an error."""
    taken = [f"name {family.name!r}"] if family.name in FAMILIES else []
    if family.model_type in MODEL_TYPES:
        taken.append(f"model_type {family.model_type!r} ({MODEL_TYPES[family.model_type].name})")
    if taken:
        raise InputError(f"register_family({family.name!r}): {' and '.join(taken)} already registered")
    if family.adapter.model_type != family.model_type:
        raise InputError(f"register_family({family.name!r}): adapter {type(family.adapter).__name__} is for "
                         f"model_type {family.adapter.model_type!r}, the family's is {family.model_type!r}")
    if family.config_class.model_type != family.model_type:
        raise InputError(f"register_family({family.name!r}): {family.config_class.__name__}.model_type is "
                         f"{family.config_class.model_type!r}, the family's is {family.model_type!r}")
    variants = _derived(family)
    FAMILIES[family.name] = family
    for f in (family, *variants):
        MODEL_TYPES[f.model_type] = f
    if _auto_registered:
        _register_auto(family, variants)
    return family


def unregister_family(name: str) -> None:
    """Remove a stock family and its variants from the registry (tests of throwaway families); the Auto classes
    keep their registration."""
    family = get_family(name)
    del FAMILIES[family.name]
    for model_type in [t for t, f in MODEL_TYPES.items() if f is family or f.base == family.name]:
        del MODEL_TYPES[model_type]


def _register_auto(family: ModelFamily, variants: list[ModelFamily]) -> None:
    for f in (family, *variants):
        if f.register is not None:
            f.register()
        else:
            AutoConfig.register(f.model_type, f.config_class, exist_ok=True)
            AutoModelForCausalLM.register(f.config_class, f.model_class, exist_ok=True)
        _auto_registered.add(f.model_type)


def register_auto_classes() -> None:
    """Make `AutoModelForCausalLM.from_pretrained` load every family and variant (Mamba-2 as transformers' class:
    `import fla.models` registers fla's own under `mamba2` first, and the Mamba-2 family registers it back)."""
    if _auto_registered:
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Triton is not supported on current platform")
        # lazy: imported under the Triton warning filter above
        import fla.models  # noqa: F401  (registers delta_net, gated_deltanet, and fla's mamba2)
    for family in list(FAMILIES.values()):
        _register_auto(family, [f for f in MODEL_TYPES.values() if f.base == family.name])


def _unknown(what: str, name, known: list[str]) -> UnknownNameError:
    close = difflib.get_close_matches(str(name), known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return UnknownNameError(f"unknown {what} {name!r}{hint} (known: {', '.join(known)})")


def get_family(name: str) -> ModelFamily:
    """A stock family by canonical name, or by its checkpoints' model_type (`delta_net` -> `deltanet`)."""
    if name in FAMILIES:
        return FAMILIES[name]
    by_type = {f.model_type: f for f in FAMILIES.values()}
    if name in by_type:
        return by_type[name]
    raise _unknown("model family", name, list(FAMILIES))


def family_for(model_or_config) -> ModelFamily:
    """The family (or derived variant) of a model, config, config dict or model_type string, by model_type."""
    if isinstance(model_or_config, str):
        model_type = model_or_config
    elif isinstance(model_or_config, dict):
        model_type = model_or_config.get("model_type")
    else:
        config = getattr(model_or_config, "config", model_or_config)
        model_type = getattr(config, "model_type", None)
    if model_type in MODEL_TYPES:
        return MODEL_TYPES[model_type]
    raise _unknown("model_type", model_type, list(MODEL_TYPES))


def build_config(family: str, **kwargs) -> PretrainedConfig:
    return get_family(family).config_class(**kwargs)


def build_model(family: str, config_kwargs: dict, seed: int = 0, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """A freshly initialised causal LM of `family` from config kwargs, seeded."""
    register_auto_classes()
    config = build_config(family, **config_kwargs)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=dtype)


def speed_presets() -> dict[str, tuple[str, dict]]:
    """Random-weight benchmark models: preset name -> (family name, config kwargs)."""
    return {name: (f.name, kwargs) for f in FAMILIES.values() for name, kwargs in f.presets.items()}


def architectures() -> dict[str, Architecture]:
    """Large public configurations for memory-plan: key -> Architecture (with its family name)."""
    return {a.key: dataclasses.replace(a, family=f.name) for f in FAMILIES.values() for a in f.architectures}


for _module in (deltanet, deltanet_shared_conv, gated_deltanet, mamba2, qwen3_5):
    register_family(_module.FAMILY)

def _wrappers() -> dict[str, str]:
    """Model types that wrap a supported one (e.g. vision-language), for configs that do not say which (no
    text_config): wrapper model_type -> the family's model_type."""
    return {w: f.model_type for f in FAMILIES.values() for w in f.wrapper_model_types}


def _text_model_hint(config, model_type: str | None, expected: str) -> str:
    """How to reach the `expected` text model from a wrapper config (vision-language models keep it in text_config)."""
    text = getattr(config, "text_config", None)
    inner = text.get("model_type") if isinstance(text, dict) else getattr(text, "model_type", None)
    wrappers = _wrappers()
    if text is None and model_type not in wrappers:
        return ""
    inner = inner or wrappers.get(model_type, expected)
    return (f"; model_type {model_type!r} is a wrapper (e.g. vision-language) around a {inner!r} text model in "
            f"config.text_config: extract it with transformers.AutoModelForCausalLM.from_pretrained(path) (which builds "
            f"the text model, e.g. Qwen3_5ForCausalLM for qwen3_5, from text_config) followed by "
            f".save_pretrained(text_dir) and its tokenizer, and reduce text_dir (its config has model_type {inner!r})")


def get_adapter(model_or_config) -> KeyChannelAdapter:
    """The adapter for a model or its config, looked up by `config.model_type`; the config must have the fields the
    adapter reads (`required_fields`)."""
    config = getattr(model_or_config, "config", model_or_config)
    model_type = getattr(config, "model_type", None)
    if model_type in MODEL_TYPES:
        adapter = MODEL_TYPES[model_type].adapter
        missing = [f for f in adapter.required_fields if not hasattr(config, f)]
        if missing:
            raise InputError(
                f"{adapter.family} adapter: the config of model_type {model_type!r} lacks {', '.join(missing)}; "
                f"expected a {adapter.model_type!r} config with {', '.join(adapter.required_fields)}"
                + _text_model_hint(config, model_type, adapter.model_type))
        return adapter
    text = getattr(config, "text_config", None)
    inner = text.get("model_type") if isinstance(text, dict) else getattr(text, "model_type", None)
    wrappers = _wrappers()
    if inner in MODEL_TYPES or model_type in wrappers:
        hint = _text_model_hint(config, model_type, inner or wrappers[model_type])
    else:
        close = difflib.get_close_matches(str(model_type), list(MODEL_TYPES), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
    raise UnknownNameError(f"no key-channel adapter for model_type {model_type!r}{hint} "
                           f"(supported: {', '.join(MODEL_TYPES)})")


def shed_classes(model_type: str) -> tuple[type, type]:
    """(config class, model class) of the structure-removal variant of a stock or `_shed` model_type."""
    family = family_for(model_type)
    if family.variant == "shed":
        return family.config_class, family.model_class
    shed = MODEL_TYPES.get(family.model_type + SHED_SUFFIX)
    if family.variant is not None or shed is None:
        stock = [f.model_type.removesuffix(SHED_SUFFIX) for f in MODEL_TYPES.values() if f.variant == "shed"]
        raise UnknownNameError(f"no structure-removal variant for model_type {model_type!r} "
                               f"(supported: {', '.join(stock)})")
    return shed.config_class, shed.model_class


def kdim_classes(model_type: str) -> tuple[type, type]:
    """(config class, model class) of the per-layer key-dim variant of a stock or `_kdim` model_type."""
    family = family_for(model_type)
    variant = family if family.variant == "kdim" else MODEL_TYPES.get(family.model_type + KDIM_SUFFIX)
    if variant is None or (family.variant not in (None, "kdim")):
        stock = [f.model_type.removesuffix(KDIM_SUFFIX) for f in MODEL_TYPES.values() if f.variant == "kdim"]
        raise UnknownNameError(f"no per-layer key-dim variant for model_type {model_type!r} "
                               f"(supported: {', '.join(stock)})")
    return variant.config_class, variant.model_class


def ralimp_classes(model_type: str) -> tuple[type, type]:
    """(config class, model class) of the linearized (RaLiMP) variant of a stock model_type."""
    variant = MODEL_TYPES.get(model_type + RALIMP_SUFFIX)
    if variant is None or MODEL_TYPES[model_type].variant is not None:  # a variant of a variant
        stock = [f.model_type.removesuffix(RALIMP_SUFFIX) for f in MODEL_TYPES.values() if f.variant == "ralimp"]
        raise UnknownNameError(f"ralimp: no linearized variant of model_type {model_type!r}; accepted: "
                               f"{', '.join(stock)}")
    return variant.config_class, variant.model_class


__all__ = ["FAMILIES", "MODEL_TYPES", "Architecture", "KernelInputs", "KernelRoute", "LoraTargets", "MixerHooks",
           "ModelFamily", "architectures", "build_config", "build_model", "family_for", "get_adapter", "get_family", "kdim_classes", "ralimp_classes",
           "register_auto_classes", "register_family", "shed_classes", "speed_presets", "unregister_family"]
