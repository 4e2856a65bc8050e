"""Post-training state reduction in linear attention models."""

__version__ = "0.1.0"
