"""Key-channel state reduction: adapters per family, calibration statistics, selectors, surgery."""

from state_reduction.pruning.types import KeyChannelAdapter, KeyChannelSelection, LayerCalibration, MixerRef

__all__ = ["KeyChannelAdapter", "KeyChannelSelection", "LayerCalibration", "MixerRef"]
