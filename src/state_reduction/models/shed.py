"""Models with structures removed by Mamba-Shedder-style surgery (`state_reduction.pruning.shed`).

Fewer decoder blocks are expressed by the stock config (`num_hidden_layers`, the layer-type list). A removed
sequence mixer or MLP inside a kept block, and MLPs of different widths per layer, are not: a model type
`<stock>_shed` (one per family, a subclass of the stock config and model) records them in its config,

- `shed_removed_mixers`: layer indices whose mixer is the identity of the residual stream (`ZeroMixer`),
- `shed_removed_mlps`: layer indices whose MLP is removed (`ZeroMLP`),
- `shed_mlp_sizes`: per layer, the MLP width (None where the layer has no MLP),

and builds the stock model, then replaces those modules, so `AutoModelForCausalLM.from_pretrained` reloads it.
Where the modules sit is each family's `StructureLayout` (`pruning/adapters/structure.py`).
"""

from __future__ import annotations

import torch
from torch import nn


SHED_SUFFIX = "_shed"


class ZeroMixer(nn.Module):
    """A removed sequence mixer: outputs zeros of its input's shape, in the structure the block unpacks
    (`output`: "tensor", "pair" = (o, attn_weights), "fla" = (o, attentions, past_key_values))."""

    def __init__(self, output: str) -> None:
        super().__init__()
        self.output = output

    def forward(self, *args, **kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        zeros = torch.zeros_like(hidden)
        if self.output == "tensor":
            return zeros
        if self.output == "pair":
            return zeros, None
        return zeros, None, kwargs.get("past_key_values")

    def extra_repr(self) -> str:
        return f"output={self.output}"


class ZeroMLP(nn.Module):
    """A removed MLP: outputs zeros of its input's shape."""

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return torch.zeros_like(x)


def remove_mixer(block: nn.Module, layout) -> None:
    """Replace the sequence mixer of a decoder block by a `ZeroMixer`: the block's residual passes through
    (shed's surgery, the shed and kdim variants' reload, and `prune --allow-layer-removal`)."""
    name = layout.mixer_name(block)
    setattr(block, name, ZeroMixer(layout.mixers[name]))


def resize_mlp(mlp: nn.Module, layout, keep: torch.Tensor | None = None, size: int | None = None) -> None:
    """Narrow a gated MLP to the channels `keep` (rows of gate/up, columns of down), or to an empty shell of
    `size` channels (reload: the weights come from the checkpoint)."""
    gate, up, down = (getattr(mlp, n) for n in (layout.mlp_gate, layout.mlp_up, layout.mlp_down))
    width = len(keep) if keep is not None else size
    new = {}
    for name, lin in ((layout.mlp_gate, gate), (layout.mlp_up, up)):
        new[name] = nn.Linear(lin.in_features, width, bias=lin.bias is not None, device=lin.weight.device,
                              dtype=lin.weight.dtype)
    new[layout.mlp_down] = nn.Linear(width, down.out_features, bias=down.bias is not None,
                                     device=down.weight.device, dtype=down.weight.dtype)
    if keep is not None:
        with torch.no_grad():
            for name, lin in ((layout.mlp_gate, gate), (layout.mlp_up, up)):
                new[name].weight.copy_(lin.weight[keep])
                if lin.bias is not None:
                    new[name].bias.copy_(lin.bias[keep])
            new[layout.mlp_down].weight.copy_(down.weight[:, keep])
            if down.bias is not None:
                new[layout.mlp_down].bias.copy_(down.bias)
    for name, lin in new.items():
        lin.requires_grad_(getattr(mlp, name).weight.requires_grad)
        setattr(mlp, name, lin)
    if hasattr(mlp, "intermediate_size"):
        mlp.intermediate_size = width


def apply_recorded_structure(model: nn.Module, config, layout) -> None:
    """Replace the modules that `config`'s shed_* fields say are removed or narrowed (model built at stock size);
    `layout` is the family's structure layout (its adapter's `structure`)."""
    blocks = layout.blocks(model)
    for i in config.shed_removed_mixers or []:
        remove_mixer(blocks[i], layout)
    for i in config.shed_removed_mlps or []:
        setattr(blocks[i], layout.mlp, ZeroMLP())
    for i, size in enumerate(config.shed_mlp_sizes or []):
        mlp = getattr(blocks[i], layout.mlp) if layout.mlp else None
        if size is not None and not isinstance(mlp, ZeroMLP) and getattr(mlp, layout.mlp_up).out_features != size:
            resize_mlp(mlp, layout, size=size)


def make_shed_variant(base_config: type, base_model: type, model_type: str, layout) -> tuple[type, type]:
    """The config and causal-LM classes of `model_type` (`<stock>_shed`): the stock classes with the shed_* fields
    (the registry, `state_reduction.models.families`, derives one per family and passes its structure `layout`)."""

    def config_init(self, shed_removed_mixers=None, shed_removed_mlps=None, shed_mlp_sizes=None, **kwargs):
        self.shed_removed_mixers = list(shed_removed_mixers or [])
        self.shed_removed_mlps = list(shed_removed_mlps or [])
        self.shed_mlp_sizes = list(shed_mlp_sizes) if shed_mlp_sizes is not None else None
        base_config.__init__(self, **kwargs)

    config_cls = type(f"Shed{base_config.__name__}", (base_config,), {
        "model_type": model_type, "__module__": __name__, "__init__": config_init,
        "__doc__": f"{base_config.__name__} with removed mixers/MLPs and per-layer MLP widths (shed_* fields)."})

    def __init__(self, config):
        base_model.__init__(self, config)
        apply_recorded_structure(self, config, layout)

    model_cls = type(f"Shed{base_model.__name__}", (base_model,), {
        "config_class": config_cls, "__init__": __init__, "__module__": __name__,
        "__doc__": f"{base_model.__name__} built with the structures its config records as removed."})
    return config_cls, model_cls
