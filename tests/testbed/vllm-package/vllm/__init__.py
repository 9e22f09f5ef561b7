"""A stand-in for the `vllm` package in the testbed's Ray image: only the model registry, so that
a preflight can ask the image which architectures its vLLM serves, as with the real package:

    python3 -c "from vllm import ModelRegistry; print(ModelRegistry.get_supported_archs())"

prints `dict_keys([...])`, as vLLM's `_ModelRegistry.get_supported_archs()` returns the keys of
its `models` dict. The `vllm` command (vllm-standin.py) reads the same registry.
"""

from vllm.model_executor.models import ModelRegistry

__version__ = "0.0.0+standin"
__all__ = ["ModelRegistry", "__version__"]
