"""A small Llama-style model with random weights, written to a local folder.

`ModelSpec(arch="qwen2")` / `"qwen3"` writes the same-sized Qwen2 (q/k/v biases) or Qwen3
(per-head q_norm/k_norm before RoPE, no biases) instead, those extra weights random too (a
forward that ignored them would differ).

Nothing is downloaded: the weights come from a seeded random initialisation, the
folder holds config.json, generation_config.json and model.safetensors, and vLLM is
run with skip_tokenizer_init (prompts are token ids), so no tokenizer is needed.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ModelSpec:
    layers: int = 2
    hidden: int = 256
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    intermediate: int = 512
    vocab: int = 2048
    max_positions: int = 4096
    # float32: vLLM's CPU attention then uses its VEC kernels on every host. With bfloat16 it
    # picks AMX where the CPU has it (Sapphire Rapids and later): KV blocks prepacked, so kvd
    # keeps objects per block size (docs/layouts.md) and no cross-block-size hit exists, and
    # greedy outputs of this sharp random model shift between runs with and without a
    # connector (a cold request differed from the no-connector baseline on such a host).
    dtype: str = "float32"
    seed: int = 1234
    arch: str = "llama"  # or "qwen2", "qwen3"

    def kv_bytes_per_token(self) -> int:
        itemsize = {"bfloat16": 2, "float16": 2, "float32": 4}[self.dtype]
        return 2 * self.layers * self.kv_heads * self.head_dim * itemsize


def write_model(folder: str, spec: ModelSpec = ModelSpec()) -> str:
    """Writes the model unless `folder` already holds this spec; returns the folder."""
    import torch
    import transformers

    marker = os.path.join(folder, "kvd_model_spec.json")
    if os.path.exists(marker):
        with open(marker) as f:
            if json.load(f) == asdict(spec):
                return folder
    os.makedirs(folder, exist_ok=True)
    name = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}[spec.arch]
    extra = {} if spec.arch == "llama" else {"use_sliding_window": False}
    config = getattr(transformers, f"{name}Config")(
        vocab_size=spec.vocab,
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_positions,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        **extra,
    )
    torch.manual_seed(spec.seed)
    with torch.no_grad():
        model = getattr(transformers, f"{name}ForCausalLM")(config)
        # Larger-than-default weights make the logits sharp, so greedy outputs depend on
        # the context (and a wrong KV shows up as a different token quickly).
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
        # Qwen2's q/k/v biases and Qwen3's q_norm/k_norm weights start as zeros and ones: draw
        # them (after the matrices, so that Llama's draws are unchanged).
        for n, p in model.named_parameters():
            if n.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")):
                p.normal_(0.0, 0.5)
            elif n.endswith(("q_norm.weight", "k_norm.weight")):
                p.uniform_(0.5, 1.5)
        model = model.to(getattr(torch, spec.dtype))
    model.save_pretrained(folder, safe_serialization=True)
    with open(marker, "w") as f:
        json.dump(asdict(spec), f)
    return folder


if __name__ == "__main__":
    import sys

    print(write_model(sys.argv[1]))
