#!/usr/bin/env python3
"""Seeds for the fuzz targets whose formats the repository keeps no files of (the tests build
them at run time with packages the fuzz machine may lack): tokenizer.json files shaped as each
family's (normalizer, pre-tokenizer, BPE flags, added tokens, post-processor; settings as in
tests/tokenizers/hf_tokenizer_families_test.py), model.safetensors.index.json files, an OLMoE
config.json, S3 replies (ListObjectsV2 pages, errors, multipart, headers), SFT JSONL lines and
PEFT adapter_config.json files.
usage: make_seeds.py SEEDS_DIR   (writes SEEDS_DIR/<target>/...)
"""
import json
import pathlib
import sys

out = pathlib.Path(sys.argv[1])


def put(target, name, text):
    d = out / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text(text if isinstance(text, str) else json.dumps(text, ensure_ascii=False))


# --- tokenizer.json -------------------------------------------------------------------------
def byte_alphabet():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


ALPHA = byte_alphabet()
VOCAB = {c: i for i, c in enumerate(ALPHA)}
for w in ["Ġt", "he", "Ġthe", "in", "Ġa", "er", "on", "Ġw", "or", "ĠĠ", "ll", "Ċ"]:
    VOCAB.setdefault(w, len(VOCAB))
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ w", "o r", "Ġ Ġ", "l l"]
QWEN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3 = QWEN.replace(r"|\p{N}|", r"|\p{N}{1,3}|")
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
BYTELEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}


def added(content, i, special=True, normalized=False):
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": normalized, "special": special}


def tokenizer(normalizer, pre, post=None, model_extra=None, extra_added=(), vocab=None, merges=None):
    vocab = dict(vocab or VOCAB)
    n = len(vocab)
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
             "ignore_merges": False, "vocab": vocab, "merges": merges or MERGES}
    model.update(model_extra or {})
    toks = [added("<|endoftext|>", n)] + [added(c, n + 1 + k, s) for k, (c, s) in enumerate(extra_added)]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": toks,
            "normalizer": normalizer, "pre_tokenizer": pre, "post_processor": post, "decoder": None,
            "model": model}


put("tokenizer", "gpt2.json", tokenizer(None, {"type": "ByteLevel", "add_prefix_space": False,
                                                "trim_offsets": True, "use_regex": True},
                                        {"type": "ByteLevel", "add_prefix_space": True,
                                         "trim_offsets": False, "use_regex": True}))
put("tokenizer", "qwen3.json", tokenizer(
    {"type": "NFC"},
    {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN}, "behavior": "Isolated", "invert": False},
        BYTELEVEL]},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
    extra_added=[("<|im_start|>", True), ("<|im_end|>", True), ("<think>", False)]))
put("tokenizer", "llama3.json", tokenizer(
    None,
    {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3}, "behavior": "Isolated", "invert": False},
        BYTELEVEL]},
    {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        {"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [len(VOCAB)],
                                              "tokens": ["<|endoftext|>"]}}}]},
    model_extra={"ignore_merges": True}))
put("tokenizer", "deepseek_v3.json", tokenizer(
    None,
    {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"\p{N}{1,3}"}, "behavior": "Isolated", "invert": False},
        {"type": "Split", "pattern": {"Regex": "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"},
         "behavior": "Isolated", "invert": False},
        {"type": "Split", "pattern": {"Regex": GPT2}, "behavior": "Isolated", "invert": False},
        BYTELEVEL]}))
# Llama-2 / Mixtral: SentencePiece-style BPE (Prepend + Replace normalizer, byte fallback).
SP_VOCAB = {"<unk>": 0, "<s>": 1, "</s>": 2}
for b in range(256):
    SP_VOCAB[f"<0x{b:02X}>"] = len(SP_VOCAB)
for w in ["▁", "t", "h", "e", "a", "▁t", "he", "▁the", "w", "o", "r", "l", "d", "▁w", "or", "ld"]:
    SP_VOCAB.setdefault(w, len(SP_VOCAB))
sp = tokenizer(
    {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                          {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
    None,
    {"type": "TemplateProcessing",
     "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
     "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
    model_extra={"unk_token": "<unk>", "fuse_unk": True, "byte_fallback": True},
    vocab=SP_VOCAB, merges=["▁ t", "h e", "▁t he", "▁ w", "o r", "l d"])
sp["added_tokens"] = [added("<unk>", 0), added("<s>", 1), added("</s>", 2)]
put("tokenizer", "llama2_mixtral.json", sp)
put("tokenizer", "olmoe_metaspace.json", tokenizer(
    {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}, {"type": "Strip", "strip_left": True, "strip_right": True}]},
    {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, {"type": "Punctuation", "behavior": "Contiguous"},
        {"type": "WhitespaceSplit"}, {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}]},
    model_extra={"continuing_subword_prefix": "##", "end_of_word_suffix": "</w>"}))
put("tokenizer", "catastrophic_split.json", tokenizer(
    None, {"type": "Split", "pattern": {"Regex": "(a|aa)+$"}, "behavior": "Isolated", "invert": False}))

# --- model.safetensors.index.json (the fuzz target's directory has these shards) -------------
S1, S2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
put("hf_index", "good.json", {"metadata": {"total_size": 24}, "weight_map": {"a": S1, "b": S1, "c": S2}})
put("hf_index", "missing_tensor.json", {"metadata": {"total_size": 24}, "weight_map": {"a": S1, "c": S2}})
put("hf_index", "wrong_shard.json", {"weight_map": {"a": S2, "b": S1, "c": S2}})
put("hf_index", "escape.json", {"weight_map": {"a": "../" + S1, "b": ".", "c": ""}})
put("hf_index", "not_object.json", {"weight_map": [S1, S2]})

# --- config.json: OLMoE (configs/published has the other families) ---------------------------
put("hf_config", "olmoe.json", {
    "architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "vocab_size": 50304,
    "hidden_size": 2048, "intermediate_size": 1024, "num_hidden_layers": 16,
    "num_attention_heads": 16, "num_key_value_heads": 16, "hidden_act": "silu",
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
    "rope_scaling": None, "attention_bias": False, "attention_dropout": 0.0, "clip_qkv": None,
    "num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": False,
    "output_router_logits": False, "router_aux_loss_coef": 0.01, "tie_word_embeddings": False,
    "pad_token_id": 1, "bos_token_id": None, "eos_token_id": 50279, "torch_dtype": "bfloat16"})
put("hf_config", "qwen3_yarn.json", {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 320,
    "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "hidden_act": "silu",
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True, "decoder_sparse_step": 1,
    "mlp_only_layers": [1], "tie_word_embeddings": False, "sliding_window": None,
    "use_sliding_window": False})

# --- S3 replies ------------------------------------------------------------------------------
put("s3", "list_page.xml", """<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>bucket</Name><Prefix>data/</Prefix><KeyCount>2</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>true</IsTruncated><NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=</NextContinuationToken><Contents><Key>data/manifest.json</Key><LastModified>2024-01-01T00:00:00.000Z</LastModified><ETag>&quot;9b2cf535f27731c974343645a3985328&quot;</ETag><Size>312</Size><StorageClass>STANDARD</StorageClass></Contents><Contents><Key>data/train-00000.h5</Key><Size>1048576</Size></Contents></ListBucketResult>""")
put("s3", "list_last.xml", "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>a&amp;b&lt;c&gt;&apos;&quot;&#38;</Key><Size>0</Size></Contents></ListBucketResult>")
put("s3", "error.xml", """<?xml version="1.0" encoding="UTF-8"?>
<Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message><BucketName>bucket</BucketName><RequestId>4442587FB7D0A2F9</RequestId></Error>""")
put("s3", "multipart.xml", "<InitiateMultipartUploadResult><Bucket>b</Bucket><Key>k</Key><UploadId>VXBsb2FkIElEIGZvciA2aWWpbmcncyBteS1tb3ZpZS5tMnRzIHVwbG9hZA</UploadId></InitiateMultipartUploadResult>")
put("s3", "headers.txt", "HTTP/1.1 200 OK\r\nx-amz-id-2: ef8yU9AS1ed4OpIszj7UDNEHGran\r\nx-amz-request-id: 318BC8BC143432E5\r\nDate: Wed, 28 Oct 2009 22:32:00 GMT\r\nLast-Modified: Wed, 12 Oct 2009 17:50:00 GMT\r\nETag: \"fba9dede5f27731c9771645a39863328\"\r\nContent-Length: 434234\r\nContent-Type: text/plain\r\nServer: AmazonS3\r\n\r\n")

# --- SFT JSONL lines -------------------------------------------------------------------------
put("sft", "messages.jsonl", {"messages": [{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": "Hi"},
                                            {"role": "assistant", "content": "Hello!"},
                                            {"role": "user", "content": "2+2?"},
                                            {"role": "assistant", "content": "4"}]})
put("sft", "sharegpt.jsonl", {"conversations": [{"from": "human", "value": "Hi"},
                                                 {"from": "gpt", "value": "Hello!"}]})
put("sft", "prompt_completion.jsonl", {"prompt": "The capital of France is", "completion": " Paris."})
put("sft", "prompt_completion_messages.jsonl", {
    "prompt": [{"role": "user", "content": "Hi"}], "completion": [{"role": "assistant", "content": "Hey"}]})
put("sft", "tools.jsonl", {
    "messages": [{"role": "user", "content": "add 2 and 2"},
                 {"role": "assistant", "content": "", "tool_calls": [
                     {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}]},
                 {"role": "tool", "content": "4"}, {"role": "assistant", "content": "4"}],
    "tools": [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]})

# --- adapter_config.json (PEFT 0.21's LoraConfig.to_dict, as save_pretrained writes it) ------
peft_common = {
    "alpha_pattern": {}, "auto_mapping": None, "base_model_name_or_path": "Qwen/Qwen3-30B-A3B", "bias": "none",
    "corda_config": None, "eva_config": None, "exclude_modules": None, "fan_in_fan_out": False,
    "inference_mode": True, "init_lora_weights": True, "layer_replication": None, "layers_pattern": None,
    "layers_to_transform": None, "loftq_config": {}, "lora_alpha": 32, "lora_bias": False,
    "lora_dropout": 0.0, "megatron_config": None, "megatron_core": "megatron.core", "modules_to_save": None,
    "peft_type": "LORA", "qalora_group_size": 16, "r": 16, "rank_pattern": {}, "revision": None,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"], "target_parameters": None,
    "task_type": "CAUSAL_LM", "trainable_token_indices": None, "use_dora": False, "use_qalora": False,
    "use_rslora": False}
put("adapter_config", "attention.json", peft_common)
put("adapter_config", "experts.json", {
    **peft_common, "target_modules": ["q_proj", "v_proj"],
    "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
    "rank_pattern": {"mlp.experts.gate_up_proj": 32}})
put("adapter_config", "rslora_modules_to_save.json", {
    **peft_common, "r": 8, "lora_alpha": 16.0, "lora_dropout": 0.05, "use_rslora": True,
    "modules_to_save": ["lm_head"], "target_parameters": ["mlp.experts.gate_up_proj"]})
