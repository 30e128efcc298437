"""What the import peak-memory tests (import_memory_test.py, qlora_memory_test.py) share: the
~1.1 GB sharded Qwen3-MoE they load (280 M parameters in fp32, built locally from transformers'
config class, every row a multiple of 64 values) and a command's peak resident memory as GNU
time reports it ("Maximum resident set size")."""
import re
import subprocess

import transformers


def one_gb_qwen3_moe_config():
    return transformers.Qwen3MoeConfig(
        vocab_size=32000, hidden_size=1024, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=4, head_dim=128, num_experts=16, num_experts_per_tok=2,
        moe_intermediate_size=1024, intermediate_size=2048, tie_word_embeddings=False,
        max_position_embeddings=256)


def peak_rss_bytes(binary, *args, env=None):
    """(exit code, peak resident bytes, stderr) of `binary args` under /usr/bin/time -v."""
    r = subprocess.run(["/usr/bin/time", "-v", binary, *map(str, args)], capture_output=True,
                       text=True, env=env)
    kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1))
    return r.returncode, kb * 1024, r.stderr
