"""CLIP (two towers: a vision transformer and a text transformer, joined by a similarity
matrix), random weights: 2 layers each, width 64."""

import torch
from transformers import CLIPConfig, CLIPModel


def build():
    torch.manual_seed(0)
    config = CLIPConfig(
        text_config={"vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
                     "num_hidden_layers": 2, "num_attention_heads": 4,
                     "max_position_embeddings": 32, "bos_token_id": 0, "eos_token_id": 2},
        vision_config={"image_size": 32, "patch_size": 8, "hidden_size": 64,
                       "intermediate_size": 128, "num_hidden_layers": 2,
                       "num_attention_heads": 4},
        projection_dim=32)
    ids = torch.randint(0, 1000, (3, 16))
    return CLIPModel(config), {"input_ids": ids, "pixel_values": torch.randn(2, 3, 32, 32)}
