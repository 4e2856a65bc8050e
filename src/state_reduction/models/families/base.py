"""What a model family provides (`ModelFamily`), and the fact types it is built from.

A family module (`state_reduction.models.families.<name>`) declares one `FAMILY = ModelFamily(...)`; the registry
(`state_reduction.models.families`) derives everything else from it: the Auto-class registration, the adapter
looked up by `config.model_type`, the RFT LoRA targets, the analysis kernel route, the speed presets and the
memory-plan architectures, and the structure-removal (`<model_type>_shed`), RaLiMP (`<model_type>_ralimp`) and
per-layer key-dim (`<model_type>_kdim`) variants.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from state_reduction.pruning.types import KeyChannelAdapter, MixerRef


@dataclass(frozen=True)
class LoraTargets:
    """Which modules RFT adapts and which parameters it trains (`state_reduction.rft.targets`)."""

    lora: tuple[str, ...]  # child names of a mixer module that get LoRA
    extra_scope: str  # "model": train_extra matches anywhere; "mixers": only inside the recurrent mixers
    unwrappable: dict[str, str] = field(default_factory=dict)  # child name -> why peft cannot wrap it


@dataclass
class KernelInputs:
    """What one mixer's recurrence saw. q, k [B, T, H, K] (normalised as in the kernel); v [B, T, HV, V];
    beta, g [B, T, HV] (g: log-decay, None = no decay); float64. decay_only: Mamba-2 (no delta term, beta = dt)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    beta: torch.Tensor
    g: torch.Tensor | None
    decay_only: bool = False


Record = Callable[[KernelInputs], None]


@dataclass(frozen=True)
class KernelRoute:
    """The layer calls its recurrence kernel through the globals of `module`: each kernel in `kernels` (name ->
    positional argument names) is wrapped while attached, and its arguments canonicalised by `canonical`."""

    module: str
    kernels: dict[str, tuple[str, ...]]
    canonical: Callable[[dict], KernelInputs]

    @contextlib.contextmanager
    def attach(self, mixers: list[MixerRef], record: Record) -> Iterator[None]:
        module = importlib.import_module(self.module)
        saved = {name: getattr(module, name) for name in self.kernels}

        def wrap(name, original):
            def kernel(*args, **kwargs):
                record(self.canonical({**dict(zip(self.kernels[name], args)), **kwargs}))
                return original(*args, **kwargs)
            return kernel

        try:
            for name, original in saved.items():
                setattr(module, name, wrap(name, original))
            yield
        finally:
            for name, original in saved.items():
                setattr(module, name, original)


@dataclass(frozen=True)
class MixerHooks:
    """The layer computes its recurrence inline: `hooks(mixer, record)` registers forward hooks on one mixer that
    rebuild the recurrence inputs, and returns their handles."""

    hooks: Callable[[torch.nn.Module, Record], list]

    @contextlib.contextmanager
    def attach(self, mixers: list[MixerRef], record: Record) -> Iterator[None]:
        handles = [h for ref in mixers for h in self.hooks(ref.module, record)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()


@dataclass(frozen=True)
class Architecture:
    """A large public configuration of the family, for `state-reduction memory-plan NAME`."""

    key: str  # the name memory-plan accepts
    name: str  # what it is (hub id)
    config: dict
    source: str  # where the numbers come from
    family: str = ""  # set by the registry


@dataclass(frozen=True)
class ModelFamily:
    """Everything the project knows about one model family. `name` is the one canonical name (tiny configs'
    `family:`, speed presets, tests); `model_type` is what the checkpoints' config.json says (an alias)."""

    name: str
    model_type: str
    description: str
    config_class: type
    model_class: type
    adapter: KeyChannelAdapter  # key channels: find mixers, read q/k, cut, rewrite the config; state bytes
    lora: LoraTargets  # RFT
    state_capture: KernelRoute | MixerHooks  # analysis: where the recurrence inputs are read
    test_config: dict  # a tiny configuration (float64 tests; a few hundred thousand parameters)
    register: Callable[[], None] | None = None  # Auto-class registration beyond (model_type, config, causal LM)
    exact_float64: bool = True  # the torch path computes in float64 for float64 inputs
    flame: bool = False  # fla-org/flame builds this family from config.json (`state_reduction.rft.flame`)
    check_config: Callable[[dict, str], None] | None = None  # checks a saved config.json dict (flame export)
    presets: dict[str, dict] = field(default_factory=dict)  # speed presets: name -> config kwargs
    architectures: tuple[Architecture, ...] = ()  # memory-plan
    tiny_checkpoints: tuple[str, ...] = ()  # folders under experiments/tiny_models/checkpoints (text models)
    recall_checkpoints: tuple[str, ...] = ()  # MQAR recall models (may be absent)
    # sets the initial per-token decay by half-life: (model, low, high, seed) -> heads set (pretraining's
    # `decay_half_life`; families without a decay gate have none)
    decay_init: Callable[..., int] | None = None
    wrapper_model_types: tuple[str, ...] = ()  # model types wrapping this text model (vision-language: text_config)
    shed: bool = True  # derive `<model_type>_shed` (models/shed.py)
    ralimp: bool = True  # derive `<model_type>_ralimp` (models/ralimp_variant.py); needs gated MLPs
    kdim: bool = True  # derive `<model_type>_kdim` (models/kdim_variant.py): a key dimension per layer
    variant: str | None = None  # set on derived variants: "shed" | "ralimp" | "kdim"
    base: str | None = None  # derived variants: the stock family's name

    def state_bytes(self, config, dtype: torch.dtype = torch.bfloat16) -> int:
        return self.adapter.state_bytes_per_sequence(config, dtype)
