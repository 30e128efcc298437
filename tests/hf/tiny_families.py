"""The tiny random Mixtral, Qwen3-MoE, OLMoE, Qwen2-MoE and gpt-oss the HF tests build from transformers' own config
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
    # q/k/v biases, a sigmoid-gated shared expert, layer 1 dense, top-k weights not renormalised
    "qwen2_moe": (transformers.Qwen2MoeConfig,
                  dict(num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                       intermediate_size=80, mlp_only_layers=[1], qkv_bias=True)),
    # sliding and full layers alternating (window 16), sinks, biases, clamped SwiGLU, YaRN
    "gpt_oss": (transformers.GptOssConfig,
                dict(num_local_experts=4, intermediate_size=48, head_dim=16, sliding_window=16)),
}

# Latent-attention families (tests/hf/deepseek_test.py has their import/export checks): num_key_
# value_heads must equal the heads, so they take COMMON with that one key changed. V3: a query
# bottleneck, sigmoid routing in 2 groups, a shared expert, a dense first layer; V2: one q_proj,
# softmax greedy routing, two shared experts.
MLA = dict(kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12,
           moe_intermediate_size=32, intermediate_size=80, n_routed_experts=4,
           first_k_dense_replace=1, num_key_value_heads=4)
MLA_FAMILIES = {
    "deepseek_v3": (transformers.DeepseekV3Config,
                    dict(MLA, q_lora_rank=24, n_shared_experts=1, n_group=2, topk_group=1,
                         routed_scaling_factor=2.5)),
    # GLM-4.7-Flash: V3's attention and router under Glm4MoeLiteConfig, dense layers by
    # mlp_layer_types (the default: the first), routed_scaling_factor 1.8, no groups
    "glm4_moe_lite": (transformers.Glm4MoeLiteConfig,
                      dict(MLA, q_lora_rank=24, n_shared_experts=1, routed_scaling_factor=1.8)),
    "deepseek_v2": (transformers.DeepseekV2Config,
                    dict(MLA, q_lora_rank=None, n_shared_experts=2, topk_method="greedy",
                         routed_scaling_factor=1.0)),
}

# GLM-4.5 (tests/hf/glm4_moe_test.py has its import/export checks): GQA with a head_dim of its own,
# q/k/v biases, q/k norms, rotary on half of each head, sigmoid routing in 2 groups with a shared
# expert and a dense first layer.
GLM_FAMILIES = {
    "glm4_moe": (transformers.Glm4MoeConfig,
                 dict(head_dim=16, partial_rotary_factor=0.5, attention_bias=True, use_qk_norm=True,
                      intermediate_size=80, moe_intermediate_size=32, n_routed_experts=4,
                      n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1,
                      routed_scaling_factor=2.5, norm_topk_prob=True, num_nextn_predict_layers=0)),
}

# MiniMax-M2 (tests/hf/minimax_m2_test.py has its import/export checks): q/k norms over the whole
# projections with num_heads x head_dim unlike hidden_size, partial rotary 0.5, sigmoid routing with a
# correction bias on the selection, renormalised top-k, experts as w1/w3/w2 per expert. Pad id 0
# (COMMON's): transformers never trains that embedding row (padding_idx), nor does moe-train
# (model.padding_idx); the full fine-tuning peer's batches hold token 0.
SIGMOID_FAMILIES = {
    "minimax_m2": (transformers.MiniMaxM2Config,
                   dict(head_dim=32, num_local_experts=8, intermediate_size=48, partial_rotary_factor=0.5,
                        rope_theta=5e6, rms_norm_eps=1e-6)),
}

# ERNIE 4.5 MoE (tests/hf/ernie4_5_moe_test.py has its import/export checks): interleaved rotary
# on GQA, softmax routing over 8 experts whose selection adds a correction bias (moe_statics) the
# weights do not get, a shared expert, layer 0 dense by moe_layer_start_index (the dense MLP wider
# than the experts), tied embeddings as the releases have them.
SOFTMAX_BIAS_FAMILIES = {
    "ernie4_5_moe": (transformers.Ernie4_5_MoeConfig,
                     dict(moe_num_experts=8, moe_intermediate_size=32, intermediate_size=80,
                          moe_num_shared_experts=1, moe_layer_start_index=1, tie_word_embeddings=True)),
}

# Mistral Small 4 (tests/hf/mistral4_test.py has its import/export checks): DeepSeek-V3's latent
# attention with YaRN (factor 4 over an original window of 16, mscale_all_dim 1) and queries scaled
# past that window (llama_4_scaling_beta 0.1: positions 16-31 of a 32-token window get 1 + 0.1 ln 2),
# softmax routing renormalised, a shared expert, a dense first layer, experts saved fused.
# transformers 5.25 maps mistral4 to no causal-LM auto class: its own class is registered with
# AutoModelForCausalLM here, for every test that builds or loads one.
transformers.AutoModelForCausalLM.register(transformers.Mistral4Config, transformers.Mistral4ForCausalLM,
                                           exist_ok=True)
MISTRAL4_FAMILIES = {
    "mistral4": (transformers.Mistral4Config,
                 dict(MLA, q_lora_rank=24, n_shared_experts=1, routed_scaling_factor=1.5,
                      rope_parameters=dict(rope_type="yarn", rope_theta=1e4, factor=4.0,
                                           original_max_position_embeddings=16, beta_fast=32.0,
                                           beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0,
                                           llama_4_scaling_beta=0.1))),
}

# Mistral Small 4 as released: Mistral3ForConditionalGeneration, the text model above under
# text_config and a one-layer Pixtral vision tower (tests/hf/mistral4_test.py's vision_language).
PIXTRAL = transformers.PixtralVisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                           num_attention_heads=2, head_dim=16, image_size=32,
                                           patch_size=8).to_dict()
MISTRAL3_VL_FAMILIES = {
    "mistral3": (transformers.Mistral3Config, dict(vision_config=PIXTRAL, tie_word_embeddings=False)),
}

# Gated DeltaNet hybrids (tests/hf/qwen3_next_test.py has their import/export checks): 3 linear-
# attention layers and 1 gated-attention layer (head_dim 32, partial rotary 0.25), two value heads
# per key head, a sigmoid-gated shared expert; Qwen3-Next with its fused projections and layer 2
# dense, Qwen3.5 with split projections.
HYBRID = dict(COMMON, num_hidden_layers=4, head_dim=32, linear_conv_kernel_dim=4,
              linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
              linear_num_value_heads=4, num_experts=4, moe_intermediate_size=32,
              shared_expert_intermediate_size=48, max_position_embeddings=4096, rms_norm_eps=1e-6,
              pad_token_id=None)
HYBRID_FAMILIES = {
    "qwen3_next": (transformers.Qwen3NextConfig,
                   dict(intermediate_size=80, mlp_only_layers=[2], norm_topk_prob=True)),
    "qwen3_5_moe_text": (transformers.Qwen3_5MoeTextConfig, {}),
}

# Nemotron-H / Nemotron 3 (tests/hf/nemotron_h_test.py has its import/export checks): one
# sublayer per block, every kind: Mamba-2 (4 heads of 16, state 8 in 2 groups, chunks of 8),
# MoE (4 relu2 experts top-2 with sigmoid scores, a correction bias and a shared expert), attention
# without positions, a dense relu2 MLP, then Mamba and MoE again. No pad id (the release's pad 0
# would zero a row whose window then carries nothing).
NEMOTRON_H = dict({k: v for k, v in COMMON.items() if k != "num_hidden_layers"}, head_dim=16,
                  layers_block_type=["linear_attention", "moe", "full_attention", "mlp",
                                     "linear_attention", "moe"],
                  intermediate_size=96, mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=8,
                  n_groups=2, chunk_size=8, n_routed_experts=4, moe_intermediate_size=32,
                  moe_shared_expert_intermediate_size=48, layer_norm_epsilon=1e-5,
                  pad_token_id=None, max_position_embeddings=4096)
# Granite 4.0-H (tests/hf/granitemoehybrid_test.py): Mamba-2 (4 heads of 32 = 2 x 64, state 8,
# chunks of 8), attention without positions, softmax-after-top-k experts beside a shared MLP in
# every layer, Granite's multipliers away from 1 (the releases' embedding 12, residual 0.22,
# logits 6 or so, attention 1/128).
GRANITE_H = dict(COMMON, num_hidden_layers=4, layer_types=["mamba", "attention", "mamba", "mamba"],
                 num_local_experts=4, intermediate_size=32, shared_intermediate_size=48,
                 mamba_n_heads=4, mamba_d_head=32, mamba_d_state=8, mamba_n_groups=1,
                 mamba_chunk_size=8, embedding_multiplier=12.0, residual_multiplier=0.22,
                 logits_scaling=6.0, attention_multiplier=0.0078125, rms_norm_eps=1e-5,
                 position_embedding_type=None, pad_token_id=None)
MAMBA_FAMILIES = {
    "nemotron_h": (transformers.NemotronHConfig, dict(NEMOTRON_H)),
    "granitemoehybrid": (transformers.GraniteMoeHybridConfig, dict(GRANITE_H)),
}

# Qwen3.5 as released: the vision-language class, the text model above under text_config and a
# one-block vision tower (tests/hf/qwen3_next_test.py's vision_language check).
VISION = dict(depth=1, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
              patch_size=4, temporal_patch_size=2, spatial_merge_size=2)
VL_FAMILIES = {
    "qwen3_5_moe": (transformers.Qwen3_5MoeConfig, dict(vision_config=VISION)),
}

# Gemma 4 MoE (tests/hf/gemma4_test.py has its import/export checks): 6 layers, five sliding
# (window 8) then one full-attention layer of head_dim 32 on 1 key/value head with K reused as V
# and proportional rotary (0.25: 4 of its 16 pairs turn, theta 1e6); q/k/v norms, a softmax scale
# of 1, sandwich norms, a dense GeGLU MLP beside 8 GeGLU experts top-2 with Gemma's router, layer
# scalars, embeddings times sqrt(48) (6.93, 6.9375 in bf16), logits soft-capped at 30, tied
# embeddings; hidden_size_per_layer_input 0 (per-layer embeddings off, as the 26B release). No pad
# id: with pad 0 (the release's) that embedding row is zero and never trained, so a window starting
# with token 0 carries an all-zero stream through every layer, whose RMSNorms' backward at zero
# input (eps^-0.5 = 1000 each, ~19 in series) sends its gradients past fp32 and fp64 alike.
GEMMA4 = dict({k: v for k, v in COMMON.items() if k != "num_experts_per_tok"}, hidden_size=48,
              pad_token_id=None,
              num_hidden_layers=6, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
              attention_k_eq_v=True, sliding_window=8, hidden_size_per_layer_input=0,
              enable_moe_block=True, num_experts=8, top_k_experts=2, moe_intermediate_size=32,
              intermediate_size=96, final_logit_softcapping=30.0, rms_norm_eps=1e-6,
              max_position_embeddings=256, tie_word_embeddings=True)
GEMMA4_FAMILIES = {
    "gemma4_text": (transformers.Gemma4TextConfig, dict(GEMMA4)),
}
# The LoRA-vs-PEFT test's Gemma 4: two layers (one sliding, one full with K = V). At six layers
# transformers' own float32 LoRA training of this random model leaves its float64 training by
# 3e-5 at step 3 and 5e-4 at step 4 (the post-norms and layer scalars in series amplify rounding;
# Qwen3-MoE's stays within 2e-7 for 20 steps); at two it stays within 2e-7 too (docs/hf.md).
GEMMA4_LORA = dict(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])

# Gemma 4 as released: Gemma4ForConditionalGeneration, the text model above under text_config
# (model.language_model.*), no vision or audio tower; pad id 0 as released (its forward needs one).
GEMMA4_RELEASE_FAMILIES = {
    "gemma4": (transformers.Gemma4Config, dict(text_config=dict(GEMMA4, pad_token_id=0),
                                               vision_config=None, audio_config=None)),
}
