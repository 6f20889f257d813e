"""OLMoE (mixture of experts in every layer, top-2 of 8, no shared expert), random weights:
2 layers, width 64."""

import torch
from transformers import OlmoeConfig, OlmoeForCausalLM


def build():
    torch.manual_seed(0)
    config = OlmoeConfig(vocab_size=1000, hidden_size=64, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                         num_experts=8, num_experts_per_tok=2, max_position_embeddings=64,
                         pad_token_id=1, eos_token_id=0,
                         use_cache=False)
    ids = torch.randint(0, config.vocab_size, (2, 32))
    return OlmoeForCausalLM(config), {"input_ids": ids}
