"""Where a family keeps the structures that Mamba-Shedder removes (arXiv 2501.17088): decoder blocks, the
sequence mixer inside a block, the MLP inside a block and its channels.

Each key-channel adapter carries one `StructureLayout` (`adapter.structure`): module paths and config field
names only; `state_reduction.pruning.shed` does the masking, surgery and search from these facts.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from state_reduction.errors import InputError

MIXER_OUTPUTS = ("tensor", "pair", "fla")  # o | (o, attn_weights) | (o, attentions, past_key_values)


@dataclass(frozen=True)
class StructureLayout:
    layers: str  # dotted path of the ModuleList of decoder blocks
    mixers: dict[str, str]  # block attribute of the sequence mixer -> what it returns (MIXER_OUTPUTS)
    mlp: str | None = None  # block attribute of the gated MLP; None: the family has no MLP (Mamba-2)
    mlp_gate: str = "gate_proj"  # rows = MLP channels
    mlp_up: str = "up_proj"  # rows = MLP channels; output multiplies the gate's activation
    mlp_down: str = "down_proj"  # columns = MLP channels
    layer_types: str | None = None  # config list with one entry per layer (Qwen3.5 `layer_types`)
    recurrent_type: str | None = None  # the entry of `layer_types` whose mixer holds a recurrent state
    attn_layers: str | None = None  # config dict.key listing softmax-attention layer indices (fla hybrids: attn.layers)

    def blocks(self, model: nn.Module) -> nn.ModuleList:
        return model.get_submodule(self.layers)

    def mixer_name(self, block: nn.Module) -> str:
        """The mixer attribute this block has (a Qwen3.5 block has linear_attn or self_attn)."""
        for name in self.mixers:
            if name in block._modules:
                return name
        raise InputError(f"{type(block).__name__}: none of the mixer attributes {', '.join(self.mixers)}")

    def attn_layer_list(self, config) -> list[int] | None:
        if self.attn_layers is None:
            return None
        field, _, key = self.attn_layers.partition(".")
        value = getattr(config, field, None)
        return list(value.get(key, [])) if value else None

    def is_recurrent(self, config, layer: int) -> bool:
        """Whether the mixer of `layer` holds a recurrent state (not a softmax-attention KV cache)."""
        if self.layer_types is not None:
            return getattr(config, self.layer_types)[layer] == self.recurrent_type
        attn = self.attn_layer_list(config)
        return layer not in (attn or [])

    def drop_layers(self, config, removed: list[int]) -> None:
        """Rewrite the config of a model whose decoder blocks `removed` are deleted (later indices shift down)."""
        keep = [i for i in range(config.num_hidden_layers) if i not in set(removed)]
        new_index = {old: new for new, old in enumerate(keep)}
        config.num_hidden_layers = len(keep)
        if self.layer_types is not None:
            types = getattr(config, self.layer_types)
            setattr(config, self.layer_types, [types[i] for i in keep])
        attn = self.attn_layer_list(config)
        if attn is not None:
            field, _, key = self.attn_layers.partition(".")
            getattr(config, field)[key] = [new_index[i] for i in attn if i in new_index]
