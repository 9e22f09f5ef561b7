"""The architectures this stand-in vLLM "serves", where the real package keeps its list
(vllm/model_executor/models/registry.py), with the same API and refusal message.

The testbed's second Ray image (`sparkform-testbed/ray:noarch`) is built by deleting the
Qwen3ForCausalLM line below: an image whose vLLM lacks the test model's architecture.
"""

# architecture -> (module, class), as vLLM's _VLLM_MODELS; the stand-in loads none of them
_VLLM_MODELS = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "Qwen3_5MoeForConditionalGeneration": ("qwen3_5", "Qwen3_5MoeForConditionalGeneration"),
}


class _ModelRegistry:
    def __init__(self, models):
        self.models = dict(models)

    def get_supported_archs(self):
        return self.models.keys()

    def register_model(self, model_arch, model_cls):
        if not isinstance(model_arch, str):
            raise TypeError(f"`model_arch` should be a string, not a {type(model_arch)}")
        self.models[model_arch] = model_cls

    def resolve_model_cls(self, architectures):
        """The (entry, architecture) of the first supported one, or vLLM's refusal."""
        if isinstance(architectures, str):
            architectures = [architectures]
        if not architectures:
            raise ValueError("No model architectures are specified")
        for arch in architectures:
            if arch in self.models:
                return self.models[arch], arch
        raise ValueError(
            f"Model architectures {architectures} are not supported for now. "
            f"Supported architectures: {self.get_supported_archs()}"
        )


ModelRegistry = _ModelRegistry(_VLLM_MODELS)
