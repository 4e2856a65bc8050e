"""Post-training state reduction in linear attention models.

Importing the package registers the model families with transformers' Auto classes (so committed
checkpoints load with `AutoModelForCausalLM.from_pretrained`). CPU execution of fla's Triton-only
pieces is installed explicitly with `state_reduction.backend.install_cpu_backend()`.
"""

__version__ = "0.1.0"

from state_reduction.models.families import register_auto_classes as _register_auto_classes

_register_auto_classes()
