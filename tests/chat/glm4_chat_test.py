"""prepare-data --format sft on GLM-4.5's chat format against transformers.

chat_templates/glm4_moe.jinja is GLM-4.5's chat template byte for byte as published with the
model on the Hugging Face Hub (huggingface.co/zai-org/GLM-4.5, chat_template.jinja; GLM-4.5-Air
ships the same text): "[gMASK]<sop>", the tools as JSON lines in a
<|system|> block, a `visible_text` macro for string or list-of-parts content, a namespace
holding the last user message's index, <think>...</think> kept only for assistant turns after
the last user message (from `reasoning_content`, or split out of the content), tool calls as
<tool_call>NAME <arg_key>K</arg_key><arg_value>V</arg_value> ... </tool_call> with non-string
values through tojson(ensure_ascii=False), and tool results in <|observation|> blocks, one
<|observation|> for a run of tool messages.

A GLM-4.5-style tokenizer directory is built here (nothing downloaded): a byte-level BPE behind
GLM-4's split regex, trained on this file's own sentences, with GLM-4.5's added tokens as its
tokenizer.json has them: <|endoftext|>, [MASK], [gMASK], [sMASK], <sop>, <eop>, <|system|>,
<|user|>, <|assistant|>, <|observation|>, the image / video / audio / transcription / code
markers special; <think>, </think>, <tool_call>, </tool_call>, <tool_response>,
</tool_response>, <arg_key>, </arg_key>, <arg_value>, </arg_value>, /nothink, <|begin_of_box|>,
<|end_of_box|>, <|image|>, <|video|> added but not special. The template ships as
chat_template.jinja beside tokenizer_config.json, as GLM-4.5 ships it.

For 32 conversations (system prompts, several turns, reasoning in `reasoning_content` (also
under the names `thinking` and `reasoning`, beside a null `reasoning_content`) and as <think>
blocks inside the content, kept or dropped by the template, tools with parameter schemas, tool
calls in OpenAI's {"function": ...} form and bare, with string, number, boolean, null, list and
object arguments, with empty, null or no content, one or several tool results, also as lists
(of {"output": ...} and strings, or of OpenAI text parts, which the template prints as Python
reprs), list-of-parts content, multilingual text, a user turn ending in /nothink, ShareGPT and
conversational prompt/completion records), the ids prepare-data writes equal
apply_chat_template(messages, tools=..., tokenize=True): transformers first drops the keys of a
message whose value is None and gives its reasoning as both reasoning_content and thinking,
so a null content renders as no content (jinja2 would print "None") and GLM-4.5 sees reasoning
passed as `thinking` or `reasoning`. (enable_thinking, which the template reads, is not set:
prepare-data passes no template arguments.)

The expected loss mask is derived here from GLM's structure, independently of src/chat/sft.cpp:
the rendered text is cut at its role tokens (<|system|>, <|user|>, <|assistant|>,
<|observation|>); an assistant turn runs from the end of its "<|assistant|>" (the template's
generation prompt) through its content (reasoning, answer, tool calls) and the role token that
follows it when that is <|user|> or <|observation|>: the tokens GLM-4.5 stops generating at
(with <|endoftext|>), as GLM-4's fine-tuning demo trains them (it shifts each assistant
message's mask one token on); a turn at the end of the text ends there. Tokens map to turns by
their offsets. A conversational prompt's turns are not trained. Then a tool call whose arguments are a JSON string
(the template calls .items() on them; transformers raises) stops the command naming file:line.

usage: glm4_chat_test.py MOE_TRAIN_BINARY TESTS_DATA_DIR
"""
import json
import pathlib
import random
import re
import subprocess
import sys
import tempfile

try:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer
    from sft_reference import check_mask, prepare_sft, reference
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

BIN, DATA = sys.argv[1], pathlib.Path(sys.argv[2])
# GLM-4's pre-tokenizer regex (its tokenizer.json's Split), then ByteLevel without a regex.
GLM4 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
           "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>",
           "<|end_of_video|>", "<|begin_of_audio|>", "<|end_of_audio|>", "<|begin_of_transcription|>",
           "<|end_of_transcription|>", "<|code_prefix|>", "<|code_middle|>", "<|code_suffix|>"]
ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
         "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "/nothink", "<|begin_of_box|>",
         "<|end_of_box|>", "<|image|>", "<|video|>"]
ROLES = ("<|system|>", "<|user|>", "<|assistant|>", "<|observation|>")
STOPS = ("<|user|>", "<|observation|>")  # GLM-4.5's generation stops (with <|endoftext|>)
REASONING = ("reasoning_content", "thinking", "reasoning")
WORDS = ("the of and to in is that it for was on are as with they at be this from what how why "
         "weather Paris's tomorrow answer question please explain step JSON API I'm We'll "
         "и в не на что он как это 中文 日本語 数据 模型 训练 مرحبا بالعالم 😀 🚀 café naïve 42 3.14 "
         "12345 x=1; {a: [b]} // <tag>").split()


def sentence(rnd, n):
    return " ".join(rnd.choice(WORDS) for _ in range(n)) + rnd.choice([".", "?", "!", "\n\nMore: x", ""])


def build(tmp):
    rnd = random.Random(1)
    corpus = [sentence(rnd, 40) for _ in range(3000)]
    corpus += ["# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
               "provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
               '{"type": "function", "function": {"name": "get_weather", "parameters": {}}}\n</tools>\n\n'
               "For each function call, output the function name and arguments within the following "
               "XML format:\n<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>"] * 50
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GLM4), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    d = tmp / "glm-4.5"
    d.mkdir()
    tok.save(str(d / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 20,
              "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
    (d / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False))
    (d / "chat_template.jinja").write_bytes((DATA / "chat_templates" / "glm4_moe.jinja").read_bytes())
    return d


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city, by day",
        "parameters": {"type": "object", "required": ["city"], "properties": {
            "city": {"type": "string", "description": "The city's name, e.g. 東京"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}}}}},
    {"type": "function", "function": {
        "name": "search_flights", "description": "Flights between two places",
        "parameters": {"type": "object", "required": ["route"], "properties": {
            "route": {"type": "object", "properties": {"from": {"type": "string"}, "to": {"type": "string"}}},
            "stops": {"type": "array", "items": {"type": "string"}},
            "flexible": {"type": "boolean"}, "budget": {"type": ["number", "null"]}}}}},
    {"type": "function", "function": {"name": "get_time", "description": "The current time",
                                      "parameters": {"type": "object", "properties": {}}}},
]


def tool_call(rnd):
    """A tool call (OpenAI's {"type", "function"} form or bare {"name", "arguments"})."""
    k = rnd.randrange(3)
    if k == 0:
        name, args = "get_weather", {"city": rnd.choice(["Paris", "東京", "Zürich", "New York\nNY"]),
                                     "days": rnd.randint(1, 7), "unit": "celsius"}
    elif k == 1:
        name, args = "search_flights", {"route": {"from": "CDG", "to": "NRT"}, "stops": ["HEL", "PEK"],
                                        "flexible": rnd.random() < 0.5, "budget": rnd.choice([None, 1250.5, 900])}
    else:
        name, args = "get_time", {}
    if rnd.random() < 0.7:
        return {"type": "function", "function": {"name": name, "arguments": args}}
    return {"name": name, "arguments": args}


def content(rnd, n):
    """Message content: a string, or (now and then) a list of text parts as OpenAI sends them."""
    if rnd.random() < 0.12:
        return [{"type": "text", "text": sentence(rnd, n)}, {"type": "text", "text": " " + sentence(rnd, 3)}]
    return sentence(rnd, n)


def conversation(rnd, i):
    """A conversation: messages, and the tools given (or None)."""
    msgs = []
    if i % 3 == 1:
        msgs.append({"role": "system", "content": content(rnd, 8)})
    tools = TOOLS if i % 2 == 1 else None
    turns = rnd.randint(1, 3)
    for turn in range(turns):
        user = {"role": "user", "content": content(rnd, rnd.randint(3, 25))}
        if i % 8 == 5 and turn == turns - 1:
            user["content"] = sentence(rnd, 6) + " /nothink"
        msgs.append(user)
        if tools and rnd.random() < 0.6:  # tool calls and their results first
            for _ in range(rnd.randint(1, 2)):
                calls = [tool_call(rnd) for _ in range(rnd.randint(1, 2))]
                call = {"role": "assistant", "tool_calls": calls}
                r = rnd.random()
                if r < 0.3:
                    call["content"] = ""
                    call["reasoning_content"] = sentence(rnd, 6)
                elif r < 0.6:
                    call["content"] = sentence(rnd, 5)  # a word before the call
                elif r < 0.8:
                    call["content"] = None  # as OpenAI's API returns a tool call
                msgs.append(call)
                for c in calls:
                    result = json.dumps({"result": sentence(rnd, 4), "ok": True}, ensure_ascii=False)
                    r = rnd.random()
                    if r < 0.1:  # results as a list, as some clients send them
                        msgs.append({"role": "tool", "content": [{"output": result}, sentence(rnd, 2)]})
                    elif r < 0.2:  # as OpenAI's text parts: the template prints each part's repr()
                        msgs.append({"role": "tool", "content": [
                            {"type": "text", "text": f"{sentence(rnd, 3)}\tcol2\u00a0{sentence(rnd, 2)}"}]})
                    else:
                        msgs.append({"role": "tool", "content": result})
        answer = {"role": "assistant", "content": content(rnd, rnd.randint(2, 30))}
        r = rnd.random()
        if i % 10 != 4 and r < 0.45:  # mostly as reasoning_content; also under its other names
            name = rnd.choice(["reasoning_content"] * 3 + ["thinking", "reasoning"])
            answer[name] = sentence(rnd, rnd.randint(4, 20))
            if name != "reasoning_content" and rnd.random() < 0.5:
                answer["reasoning_content"] = None
        elif i % 10 != 4 and r < 0.65 and isinstance(answer["content"], str):
            answer["content"] = f"<think>\n{sentence(rnd, 8)}\n</think>\n\n{answer['content']}"
        msgs.append(answer)
    if tools and i % 4 == 3:  # ends in a tool call (no result yet)
        msgs.append({"role": "user", "content": sentence(rnd, 5)})
        msgs.append({"role": "assistant", "content": "", "reasoning_content": sentence(rnd, 7),
                     "tool_calls": [tool_call(rnd)]})
    return msgs, tools


def record(msgs, tools, i):
    """The JSONL record for a conversation, and the index of its first trained message."""
    plain = all(set(m) == {"role", "content"} and isinstance(m["content"], str) for m in msgs)
    if i % 10 == 4 and not tools and plain:  # ShareGPT
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


def glm_spans(text, msgs, first):
    """The assistant turns' character spans, from GLM's role tokens (see the module docstring)."""
    marks = sorted((m.start(), m.end(), m.group()) for m in re.finditer("|".join(map(re.escape, ROLES)), text))
    spans = []
    for k, (_, end, role) in enumerate(marks):
        if role != "<|assistant|>":
            continue
        if k + 1 == len(marks):
            stop = len(text)
        else:
            start, nend, nrole = marks[k + 1]
            stop = nend if nrole in STOPS else start
        spans.append((end, stop))
    assistants = [j for j, m in enumerate(msgs) if m["role"] == "assistant"]
    assert len(spans) == len(assistants), (len(spans), len(assistants), text)
    return [span for span, j in zip(spans, assistants) if j >= first]


def first_difference(a, b):
    return next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))


def main():
    n = 32
    with tempfile.TemporaryDirectory() as d:
        tmp = pathlib.Path(d)
        tok_dir = build(tmp)
        tok = AutoTokenizer.from_pretrained(str(tok_dir))
        assert "[gMASK]<sop>" in tok.chat_template, "the template did not load from chat_template.jinja"
        rnd = random.Random(11)
        convs = [conversation(rnd, i) for i in range(n)]
        records = [record(msgs, tools, i) for i, (msgs, tools) in enumerate(convs)]
        docs, manifest = prepare_sft(BIN, [r for r, _ in records], tmp, tok_dir)
        assert manifest["loss_mask"] is True and len(docs) == n, (manifest, len(docs))
        targets = compared = 0
        seen = {"kept reasoning": 0, "dropped reasoning": 0, "tool calls": 0, "tool results": 0,
                "system": 0, "list content": 0, "/nothink": 0, "null content": 0, "thinking, reasoning": 0,
                "text-part results": 0}
        for i, ((msgs, tools), (_, first), (ids, mask)) in enumerate(zip(convs, records, docs)):
            want_ids, want_mask, text = reference(tok, msgs, tools, first, glm_spans)
            if list(ids) != want_ids:
                j = first_difference(list(ids), want_ids)
                raise SystemExit(f"FAIL conversation {i}: ids differ from token {j}:\n"
                                 f"prepare-data: {tok.decode(list(ids)[j:j + 12])!r}\n"
                                 f"transformers: {tok.decode(want_ids[j:j + 12])!r}\n{text}")
            check_mask(i, tok, ids, mask, want_mask, text)
            assert sum(want_mask) > 0
            # Each trained stretch starts right after <|assistant|> and ends with <|user|>,
            # <|observation|> or the end of the conversation.
            pieces = [tok.decode([t]) for t in ids]
            for j in range(len(ids)):
                if mask[j] and (j == 0 or not mask[j - 1]):
                    assert j > 0 and pieces[j - 1] == "<|assistant|>", (i, j, pieces[j - 1:j + 3])
                if mask[j] and j + 1 < len(ids) and not mask[j + 1]:
                    assert pieces[j] in STOPS, (i, j, pieces[j - 2:j + 2])
                if mask[j]:
                    assert pieces[j] not in ("<|system|>", "<|assistant|>", "[gMASK]", "<sop>"), (i, j)
            targets += sum(want_mask)
            compared += len(want_ids)
            seen["kept reasoning"] += bool(re.search(r"<think>[^<]", text))
            seen["dropped reasoning"] += any(
                any(m.get(k) for k in REASONING) or "</think>" in str(m.get("content"))
                for m in msgs[:max(j for j, m in enumerate(msgs) if m["role"] == "user")])
            seen["tool calls"] += "<tool_call>" in text.split("</tools>")[-1]
            seen["tool results"] += "<|observation|>" in text
            seen["system"] += any(m["role"] == "system" for m in msgs)
            seen["list content"] += any(isinstance(m.get("content"), list) for m in msgs)
            seen["/nothink"] += "/nothink<|assistant|>" in text
            seen["null content"] += any("content" in m and m["content"] is None for m in msgs)
            seen["thinking, reasoning"] += any(m.get("thinking") or m.get("reasoning") for m in msgs)
            seen["text-part results"] += "<tool_response>\n{'type': 'text'" in text
        assert manifest["target_tokens"] == targets, (manifest["target_tokens"], targets)
        assert all(seen.values()), seen
        kinds = {"tools": sum(1 for _, t in convs if t), "sharegpt": sum(1 for r, _ in records if "conversations" in r),
                 "prompt/completion": sum(1 for r, _ in records if "prompt" in r)}
        assert all(kinds.values()), kinds
        print(f"GLM-4.5: {n} conversations ({kinds}, {seen}): ids equal apply_chat_template "
              f"({compared} tokens), masks equal the assistant turns ({targets} target tokens)")

        # A tool call whose arguments are a JSON string: the template calls .items() on it, and
        # transformers raises; prepare-data stops naming the line.
        bad = {"messages": [{"role": "user", "content": "hi"},
                            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                                "name": "get_time", "arguments": "{}"}}]}], "tools": TOOLS}
        try:
            tok.apply_chat_template(bad["messages"], tools=TOOLS, tokenize=False)
            raise AssertionError("transformers rendered string arguments")
        except Exception as e:  # jinja2's UndefinedError (str has no attribute items)
            assert "items" in str(e), e
        (tmp / "bad.jsonl").write_text(json.dumps(records[0][0]) + "\n" + json.dumps(bad) + "\n")
        r = subprocess.run([BIN, "prepare-data", tmp / "bad.jsonl", "--out", tmp / "bad-out", "--format", "sft",
                            "--tokenizer-from", tok_dir], capture_output=True, text=True)
        assert r.returncode == 2 and "bad.jsonl:2:" in r.stderr, r.stderr
        assert not (tmp / "bad-out").exists()
        print(f"refused: {r.stderr.strip()[:160]}")
    print("ok")


main()
