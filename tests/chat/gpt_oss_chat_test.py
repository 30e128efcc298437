"""prepare-data --format sft on gpt-oss's chat format ("harmony") against transformers.

A gpt-oss-style tokenizer directory is built here (nothing downloaded): a byte-level BPE behind
the o200k Split regex then ByteLevel(use_regex=false), as gpt-oss's tokenizer.json has it, with
harmony's special tokens (<|start|>, <|end|>, <|message|>, <|channel|>, <|return|>, <|call|>,
<|constrain|>, <|endoftext|>, <|startoftext|>) and tokenizer_config.json carrying
chat_templates/gpt_oss.jinja (a reconstruction of gpt-oss-20b's template: macros with default
arguments rendering the tools as a TypeScript namespace, recursively for nested schemas;
namespaces; loop.index / loop.last; raise_exception; strftime_now). For 30 conversations
(system or developer instructions, several turns, reasoning in `thinking`, tools with nested
parameter schemas, tool calls with and without analysis and their results, ShareGPT and
conversational prompt/completion records, multilingual text), the ids prepare-data writes equal
apply_chat_template(messages, tools=..., tokenize=True), and the loss mask is set exactly on the
assistant turns. The expected mask is derived here from the harmony structure of transformers'
rendered text, independently of src/chat/sft.cpp: the text is cut into harmony messages
(<|start|>HEADER<|message|>BODY then <|end|>, <|return|> or <|call|>); each run of consecutive
messages whose author is the assistant is one assistant message of the conversation (its analysis,
then its final answer or tool call), and its turn runs from the end of the first
"<|start|>assistant" (the generation prompt) to the end of the run's last message, inclusive;
tokens map to it by their offsets. A conversation's prompt turns (conversational
prompt/completion) are not trained. Then a template error (a message with <|channel|> tags in its
content: the template's raise_exception) stops the command naming file:line.

usage: gpt_oss_chat_test.py MOE_TRAIN_BINARY TESTS_DATA_DIR
"""
import json
import pathlib
import random
import re
import subprocess
import sys
import tempfile

try:
    from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer
    from sft_reference import read_docs, reference
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

BIN, DATA = sys.argv[1], pathlib.Path(sys.argv[2])
# gpt-oss's (o200k's) pre-tokenizer regex, as its tokenizer.json writes it.
O200K = ("[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
         "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"
         "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
         "[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
SPECIAL = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>",
           "<|end|>", "<|message|>", "<|call|>"]
ENDS = ("<|end|>", "<|return|>", "<|call|>")
WORDS = ("the of and to in is that it for was on are as with they at be this from what how why "
         "WEATHER Paris's tomorrow answer question please explain step JSON API I'm We'll "
         "и в не на что он как это 中文 日本語 数据 模型 训练 مرحبا بالعالم 😀 🚀 café naïve 42 3.14 "
         "12345 x=1; {a: [b]} // <tag>").split()


def sentence(rnd, n):
    return " ".join(rnd.choice(WORDS) for _ in range(n)) + rnd.choice([".", "?", "!", "\n\nMore: x", ""])


def build(tmp):
    rnd = random.Random(1)
    corpus = [sentence(rnd, 40) for _ in range(3000)]
    corpus += ["You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\n"
               "# Valid channels: analysis, commentary, final. Channel must be included for every message.",
               "## functions\n\nnamespace functions {\n\n// Weather for a city\ntype get_weather = (_: {\n"
               "city: string,\n}) => any;\n\n} // namespace functions"] * 50
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(O200K), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=3000, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    d = tmp / "gpt-oss"
    d.mkdir()
    tok.save(str(d / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 20,
              "chat_template": (DATA / "chat_templates" / "gpt_oss.jinja").read_text(),
              "bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>"}
    (d / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False))
    return d


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "required": ["city"], "properties": {
            "city": {"type": "string", "description": "The city's name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
            "days": {"type": "integer", "description": "How many days", "default": 1},
            "hours": {"type": "array", "items": {"type": "integer"}, "nullable": True}}}}},
    {"type": "function", "function": {
        "name": "search_flights", "description": "Flights between two places",
        "parameters": {"type": "object", "required": ["route"], "properties": {
            "route": {"type": "object", "required": ["from"], "properties": {
                "from": {"type": "string"}, "to": {"type": "string"},
                "stops": {"type": "array", "items": {"type": "object", "properties": {
                    "code": {"type": "string"}}}}}},
            "when": {"oneOf": [{"type": "string", "description": "a date"}, {"type": "number"}]},
            "cabin": {"type": ["string", "null"]},
            "flexible": {"type": "boolean"}}}}},
    {"type": "function", "function": {"name": "get_time", "description": "The current time",
                                      "parameters": {"type": "object", "properties": {}}}},
]


def tool_call(rnd):
    if rnd.random() < 0.5:
        return "get_weather", {"city": rnd.choice(["Paris", "東京", "Zürich"]), "days": rnd.randint(1, 5)}
    return "search_flights", {"route": {"from": "CDG", "to": "NRT", "stops": [{"code": "HEL"}]}, "when": "2025-01-02"}


def conversation(rnd, i):
    """A conversation: messages, and the tools given (or None)."""
    msgs = []
    if i % 3 == 1:
        msgs.append({"role": "system", "content": sentence(rnd, 8)})
    elif i % 3 == 2:
        msgs.append({"role": "developer", "content": sentence(rnd, 10)})
    tools = TOOLS if i % 2 == 1 else None
    turns = rnd.randint(1, 3)
    for turn in range(turns):
        msgs.append({"role": "user", "content": sentence(rnd, rnd.randint(3, 25))})
        if tools and rnd.random() < 0.6:  # one or two tool calls and their results first
            for _ in range(rnd.randint(1, 2)):
                name, args = tool_call(rnd)
                call = {"role": "assistant", "tool_calls": [{"type": "function", "function": {
                    "name": name, "arguments": args}}]}
                if rnd.random() < 0.5:
                    call["thinking"] = sentence(rnd, 6)
                elif rnd.random() < 0.5:
                    call["content"] = sentence(rnd, 5)  # analysis written as content
                msgs.append(call)
                msgs.append({"role": "tool", "content": json.dumps({"result": sentence(rnd, 4), "ok": True},
                                                                   ensure_ascii=False)})
        answer = {"role": "assistant", "content": sentence(rnd, rnd.randint(2, 30))}
        if rnd.random() < 0.6 and i % 10 != 4:  # (ShareGPT records carry no reasoning)
            answer["thinking"] = sentence(rnd, rnd.randint(4, 20))
        msgs.append(answer)
    if tools and i % 4 == 3:  # ends in a tool call whose analysis is kept (no final answer after it)
        name, args = tool_call(rnd)
        msgs.append({"role": "user", "content": sentence(rnd, 5)})
        msgs.append({"role": "assistant", "thinking": sentence(rnd, 7), "tool_calls": [
            {"type": "function", "function": {"name": name, "arguments": args}}]})
    return msgs, tools


def record(msgs, tools, i):
    """The JSONL record for a conversation, and the index of its first trained message."""
    if i % 10 == 4 and not tools and all(set(m) == {"role", "content"} for m in msgs):  # ShareGPT
        return {"conversations": [{"from": {"user": "human", "assistant": "gpt"}.get(m["role"], m["role"]),
                                   "value": m["content"]} for m in msgs]}, 0
    if i % 10 == 7:  # conversational prompt/completion: the prompt's answers are not trained
        cut = len(msgs) - 1
        rec = {"prompt": msgs[:cut], "completion": msgs[cut:]}
    else:
        cut, rec = 0, {"messages": msgs}
    if tools:
        rec["tools"] = tools
    return rec, cut


def harmony_spans(text, msgs, first):
    """The assistant turns' character spans, from the harmony messages of the rendered text."""
    parts = []  # (start, end, author) of each harmony message
    for m in re.finditer(re.escape("<|start|>"), text):
        body = text.index("<|message|>", m.end())
        header = text[m.end():body]
        author = re.split(r"[ <]", header, maxsplit=1)[0]
        end = min(text.find(t, body) + len(t) for t in ENDS if text.find(t, body) >= 0)
        parts.append((m.start(), end, author))
    runs = []  # [start, end] of each run of assistant messages
    for k, (start, end, author) in enumerate(parts):
        if author == "assistant" and k > 0 and parts[k - 1][2] == "assistant":
            runs[-1][1] = end
        elif author == "assistant":
            runs.append([start + len("<|start|>assistant"), end])
    assistants = [j for j, m in enumerate(msgs) if m["role"] == "assistant"]
    assert len(runs) == len(assistants), (len(runs), len(assistants), text)
    return [span for span, j in zip(runs, assistants) if j >= first]


def main():
    with tempfile.TemporaryDirectory() as d:
        tmp = pathlib.Path(d)
        tok_dir = build(tmp)
        tok = AutoTokenizer.from_pretrained(str(tok_dir))
        rnd = random.Random(7)
        convs = [conversation(rnd, i) for i in range(30)]
        records = [record(msgs, tools, i) for i, (msgs, tools) in enumerate(convs)]
        (tmp / "chat.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r, _ in records))
        out = tmp / "ds"
        r = subprocess.run([BIN, "prepare-data", tmp / "chat.jsonl", "--out", out, "--format", "sft",
                            "--tokenizer-from", tok_dir], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        docs, manifest = read_docs(out)
        assert manifest["loss_mask"] is True and len(docs) == 30, (manifest, len(docs))
        targets = 0
        seen = {"thinking": 0, "tool calls": 0, "tool results": 0, "developer": 0, "system": 0}
        for i, ((msgs, tools), (_, first), (ids, mask)) in enumerate(zip(convs, records, docs)):
            want_ids, want_mask, text = reference(tok, msgs, tools, first, harmony_spans)
            assert list(ids) == want_ids, (i, msgs, tok.decode(ids), text)
            if list(mask) != want_mask:
                bad = [j for j in range(len(mask)) if mask[j] != want_mask[j]]
                raise SystemExit(f"FAIL conversation {i}: mask differs at tokens {bad[:10]}: "
                                 f"{[tok.decode([ids[j]]) for j in bad[:10]]}\n{text}")
            assert sum(want_mask) > 0
            # Each trained stretch ends with a harmony end token; a header inside one is the
            # assistant's own (its final answer or tool call after its analysis).
            pieces = [tok.decode([t]) for t in ids]
            for j in range(len(ids)):
                if mask[j] and (j + 1 == len(ids) or not mask[j + 1]):
                    assert pieces[j] in ENDS, (i, j, pieces[j])
                if mask[j] and pieces[j] == "<|start|>":
                    assert "".join(pieces[j + 1:j + 9]).startswith("assistant"), (i, j, pieces[j:j + 9])
            targets += sum(want_mask)
            seen["thinking"] += "<|channel|>analysis" in text
            seen["tool calls"] += "<|call|>" in text
            seen["tool results"] += " to=assistant<|channel|>" in text
            seen["developer"] += "# Instructions" in text
            seen["system"] += msgs[0]["role"] == "system"
        assert manifest["target_tokens"] == targets, (manifest["target_tokens"], targets)
        assert all(seen.values()), seen
        kinds = {"tools": sum(1 for _, t in convs if t), "sharegpt": sum(1 for r, _ in records if "conversations" in r),
                 "prompt/completion": sum(1 for r, _ in records if "prompt" in r)}
        print(f"gpt-oss harmony: 30 conversations ({kinds}, {seen}): ids equal apply_chat_template, masks "
              f"equal the assistant turns ({targets} target tokens of {sum(len(x[0]) for x in docs)})")

        # The template's raise_exception: a message with <|channel|> tags in its content.
        bad = {"messages": [{"role": "user", "content": "hi"},
                            {"role": "assistant", "content": "<|channel|>final<|message|>yo"}]}
        (tmp / "bad.jsonl").write_text(json.dumps(records[0][0]) + "\n" + json.dumps(bad) + "\n")
        r = subprocess.run([BIN, "prepare-data", tmp / "bad.jsonl", "--out", tmp / "bad-out", "--format", "sft",
                            "--tokenizer-from", tok_dir], capture_output=True, text=True)
        assert r.returncode == 2 and "bad.jsonl:2:" in r.stderr and "<|channel|> tags" in r.stderr, r.stderr
        assert not (tmp / "bad-out").exists()
        print(f"refused: {r.stderr.strip()[:160]}")
    print("ok")


main()
