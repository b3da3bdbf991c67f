"""vLLM general plugin (entry point `vllm.general_plugins: kvd_blend`): registers the
blend-aware model classes (kvd_blend.model) for Llama, Qwen2 and Qwen3.

vLLM runs it in every process before a model is built. The classes behave exactly like
vLLM's own unless a step carries blend plans from KvdBlendConnector, so registering them
changes nothing for engines that do not use the connector. `KVD_BLEND_REGISTER=0` turns the
registration off.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("vllm.kvd_blend")  # under vLLM's logger: its handlers and level

ARCHITECTURES = {
    "LlamaForCausalLM": "kvd_blend.model:KvdBlendLlamaForCausalLM",
    "Qwen2ForCausalLM": "kvd_blend.model:KvdBlendQwen2ForCausalLM",
    "Qwen3ForCausalLM": "kvd_blend.model:KvdBlendQwen3ForCausalLM",
}


def register() -> None:
    if os.environ.get("KVD_BLEND_REGISTER", "1") == "0":
        return
    from vllm import ModelRegistry  # noqa: PLC0415

    for arch, target in ARCHITECTURES.items():
        ModelRegistry.register_model(arch, target)
    logger.debug("kvd_blend: blend-aware classes registered for %s", ", ".join(ARCHITECTURES))
