"""Model families the project supports and their Auto-class registration."""

from state_reduction.models.registry import FAMILIES, ModelFamily, build_config, build_model, get_family, register_auto_classes

__all__ = ["FAMILIES", "ModelFamily", "build_config", "build_model", "get_family", "register_auto_classes"]
