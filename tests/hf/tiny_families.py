"""The tiny random Mixtral, Qwen3-MoE, OLMoE and gpt-oss the HF tests build from transformers' own config
classes (nothing is downloaded): 3 layers, 4 experts, top-2, 4 query heads on 2 key/value heads,
vocab 320; Qwen3-MoE with layer 1 dense and renormalised top-k, OLMoE with clip_qkv, gpt-oss with
its own settings (tests/hf/gpt_oss_test.py has the larger gpt-oss checks)."""
import transformers

COMMON = dict(vocab_size=320, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
              num_experts_per_tok=2, bos_token_id=1, eos_token_id=2, pad_token_id=0)
FAMILIES = {
    "mixtral": (transformers.MixtralConfig, dict(num_local_experts=4, intermediate_size=48)),
    # layer 1 dense (mlp_only_layers), renormalised top-k
    "qwen3_moe": (transformers.Qwen3MoeConfig,
                  dict(num_experts=4, moe_intermediate_size=32, intermediate_size=80,
                       mlp_only_layers=[1], norm_topk_prob=True)),
    "olmoe": (transformers.OlmoeConfig, dict(num_experts=4, intermediate_size=48, clip_qkv=8.0)),
    # sliding and full layers alternating (window 16), sinks, biases, clamped SwiGLU, YaRN
    "gpt_oss": (transformers.GptOssConfig,
                dict(num_local_experts=4, intermediate_size=48, head_dim=16, sliding_window=16)),
}
