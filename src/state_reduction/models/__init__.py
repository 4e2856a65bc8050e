"""Model families the project supports (one module each in `families`), their registry and Auto-class registration."""

from state_reduction.models.families import (
    FAMILIES,
    ModelFamily,
    build_config,
    build_model,
    family_for,
    get_family,
    register_auto_classes,
    register_family,
)

__all__ = ["FAMILIES", "ModelFamily", "build_config", "build_model", "family_for", "get_family",
           "register_auto_classes", "register_family"]
