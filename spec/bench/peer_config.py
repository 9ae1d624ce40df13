# The Qwen3-Next configuration at the 30b-a3b-shape preset's dimensions that both transformers
# peers build (peer-transformers.py, peer-same-weights.py), with `layers` layers. transformers'
# Qwen3-Next always has a shared expert (768 wide here); the preset has none. `random_model`
# makes it on the GPU with random bf16 weights (seed 0) and says how long that took.
import time

import torch
from transformers import AutoModelForCausalLM, Qwen3NextConfig


def qwen3_next_30b_shape(layers: int) -> Qwen3NextConfig:
    return Qwen3NextConfig(vocab_size=151936, hidden_size=2048, num_hidden_layers=layers, num_attention_heads=32,
        num_key_value_heads=4, head_dim=128, partial_rotary_factor=0.25, rope_theta=1e7, linear_num_value_heads=32,
        linear_num_key_heads=16, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4, num_experts=128,
        num_experts_per_tok=8, moe_intermediate_size=768, shared_expert_intermediate_size=768, intermediate_size=6144,
        full_attention_interval=4, decoder_sparse_step=1, norm_topk_prob=True, max_position_embeddings=8192,
        tie_word_embeddings=False)


def random_model(layers: int):
    torch.manual_seed(0)
    t0 = time.time()
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(qwen3_next_30b_shape(layers), torch_dtype=torch.bfloat16)
    model.eval()
    return model, time.time() - t0
