"""What the chat-template tests share: reading prepare-data's SFT shards back, and the
transformers side of a comparison (ids from apply_chat_template, the mask from the assistant
spans a test derives from the rendered text)."""
import json
import subprocess

import h5py
import numpy as np


def read_docs(out):
    """Each document's (ids, loss mask) of prepare-data's training split, and its manifest."""
    m = json.loads((out / "manifest.json").read_text())
    docs = []
    for sh in m["splits"]["train"]:
        with h5py.File(out / sh["file"], "r") as f:
            t = np.asarray(f["tokens"][:], dtype=np.int64)
            mk = np.asarray(f["loss_mask"][:], dtype=np.int64)
            offs = list(np.asarray(f["doc_offsets"][:])) + [len(t)]
        docs += [(t[a:b], mk[a:b]) for a, b in zip(offs[:-1], offs[1:])]
    return docs, m


def prepare_sft(binary, records, tmp, tok_dir):
    """prepare-data --format sft over `records` (one JSON object a line) with the tokenizer directory
    `tok_dir`, which must succeed: each document's (ids, loss mask), and the manifest."""
    src, out = tmp / "chat.jsonl", tmp / "ds"
    src.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    r = subprocess.run([binary, "prepare-data", src, "--out", out, "--format", "sft", "--tokenizer-from", tok_dir],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return read_docs(out)


def check_mask(i, tok, ids, mask, want_mask, text):
    """Conversation i's mask from prepare-data equals the expected one; else stop naming the first
    differing tokens (their positions, prepare-data's bits, their text) and the rendered text."""
    if list(mask) != want_mask:
        bad = [j for j in range(len(mask)) if mask[j] != want_mask[j]]
        raise SystemExit(f"FAIL conversation {i}: mask differs at tokens {bad[:10]} "
                         f"(prepare-data {[int(mask[j]) for j in bad[:10]]}): "
                         f"{[tok.decode([ids[j]]) for j in bad[:10]]}\n{text}")


def rendered(tok, msgs, tools):
    """apply_chat_template's text and ids, and the text's encoding with offsets (its ids the same)."""
    text = tok.apply_chat_template(msgs, tools=tools, tokenize=False)
    ids = tok.apply_chat_template(msgs, tools=tools, tokenize=True)
    if not isinstance(ids, list):
        ids = ids["input_ids"]
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    assert enc["input_ids"] == list(ids)
    return text, list(ids), enc


def reference(tok, msgs, tools, first, spans_of):
    """transformers' ids and text, and the mask of the assistant turns: spans_of(text, msgs, first)
    gives their character spans; a token is trained when its offsets overlap one."""
    text, ids, enc = rendered(tok, msgs, tools)
    spans = spans_of(text, msgs, first)
    mask = [int(any(b > s and a < e for s, e in spans)) for a, b in enc["offset_mapping"]]
    return ids, mask, text
