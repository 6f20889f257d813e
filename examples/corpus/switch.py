"""Switch Transformer (encoder-decoder, top-1 routing over 4 experts in every other layer),
random weights: 2 + 2 layers, width 64.

Expected to fail to trace with transformers 5.x: the router's forward reassigns a submodule
(`self.classifier = self.classifier.to(self.dtype)`), which torch.export cannot trace (`_apply():
Couldn't swap Linear.weight`), and torch.fx cannot trace transformers' wrapped forward either.
The attention mask is passed, as a tokenizer returns it: without it the encoder, under export,
skips building its default mask and fails earlier on indexing None."""

import torch
from transformers import SwitchTransformersConfig, SwitchTransformersForConditionalGeneration


def build():
    torch.manual_seed(0)
    config = SwitchTransformersConfig(vocab_size=1000, d_model=64, d_kv=16, d_ff=128,
                                      expert_capacity=64, num_layers=2, num_decoder_layers=2,
                                      num_heads=4, num_experts=4, encoder_sparse_step=2,
                                      decoder_sparse_step=2, decoder_start_token_id=0,
                                      use_cache=False)
    ids = torch.randint(0, config.vocab_size, (2, 32))
    decoder_ids = torch.randint(0, config.vocab_size, (2, 16))
    return SwitchTransformersForConditionalGeneration(config), {
        "input_ids": ids, "attention_mask": torch.ones_like(ids),
        "decoder_input_ids": decoder_ids}
