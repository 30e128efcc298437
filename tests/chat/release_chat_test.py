"""prepare-data --format sft on the chat formats of 2026's releases against transformers.

gemma4: chat_templates/gemma4.jinja is Gemma 4's chat template as llama.cpp's
models/templates/gemma4.jinja carries it (12,133 bytes): <|turn>ROLE ... <turn|> turns, the
assistant's role written "model", a system turn holding the system prompt and the tools as
`declaration:NAME{...}` lines built by recursive macros (dictsort, namespaces, `map('upper')`),
tool calls as <|tool_call>call:NAME{key:value,...}<tool_call|> with strings quoted by <|"|>, tool
results from a message's `tool_responses`, thinking (<|channel>...<channel|>) stripped from the
model's history, and a generation prompt that ends in an empty thought channel the history never
repeats. That last part made prepare-data refuse every Gemma 4 conversation: a turn now starts
after the part of the prompt the history has ("<|turn>model\n").

minimax_m2: chat_templates/minimax_m2.jinja is MiniMax-M2's template as Unsloth fixed it (Apache
2.0; llama.cpp's models/templates/unsloth-MiniMax-M2.jinja, 7,224 bytes): ]~!b[ ]~b]ROLE ... [e~[
turns, tools as <tool>JSON</tool> lines, calls as <minimax:tool_call><invoke name=...><parameter
name=...>, reasoning (`reasoning_content` or <think> in the content) kept only after the last user
turn, and a generation prompt "]~b]ai\n<think>\n": a turn with kept reasoning starts after it, one
without after "]~b]ai\n".

A tokenizer directory is built here (nothing downloaded): a byte-level BPE trained on this file's
sentences with the family's control tokens added. For 24 conversations (system prompts, tools with
nested, enum, array and nullable parameters, tool calls with string / number / boolean / list /
object arguments, tool results, reasoning, list-of-parts user content, several rounds), the ids
prepare-data writes equal apply_chat_template(messages, tools=..., tokenize=True), and the loss
mask is 1 exactly on the assistant turns: from after the turn's opener (and MiniMax's "<think>\n")
through its end-of-turn token, tool calls included (derived here from the text, independently of
src/chat/sft.cpp).

usage: release_chat_test.py MOE_TRAIN_BINARY TESTS_DATA_DIR FAMILY"""
import json
import pathlib
import random
import sys
import tempfile

try:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer
    from sft_reference import check_mask, prepare_sft, reference
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

BIN, DATA, FAMILY = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]
GEMMA_SPECIAL = ["<pad>", "<eos>", "<bos>", "<|turn>", "<turn|>", "<|think|>", "<|channel>", "<channel|>",
           "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>",
           '<|"|>', "<|image|>", "<|audio|>", "<|video|>"]
KIMI_SPECIAL = ["[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>",
                "<|im_middle|>", "<think>", "</think>", "<|tool_calls_section_begin|>",
                "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
                "<|tool_call_end|>", "<|media_start|>", "<|media_content|>", "<|media_pad|>", "<|media_end|>"]
# family: (template, special tokens, added tokens, bos, eos, turn opener, its optional tail, turn end)
FAMILIES = {
    "gemma4": ("gemma4.jinja", GEMMA_SPECIAL, [], "<bos>", "<eos>", "<|turn>model\n", "", "<turn|>"),
    "minimax_m2": ("minimax_m2.jinja", ["]~!b[", "]~b]", "[e~["],
                   ["<think>", "</think>", "<minimax:tool_call>", "</minimax:tool_call>"], "]~!b[", "[e~[",
                   "]~b]ai\n", "<think>\n", "[e~["),
    "kimi_k2": ("kimi_k2_thinking.jinja", KIMI_SPECIAL, [], "[BOS]", "[EOS]",
                "<|im_assistant|>assistant<|im_middle|>", "", "<|im_end|>"),
}
TEMPLATE, SPECIAL, ADDED, BOS, EOS, OPENER, OPENER_TAIL, TURN_END = FAMILIES[FAMILY]
WORDS = ("the a weather city flight time sky blue sea why how when Paris Tokyo 東京 météo Straße "
         "sunny rain cold warm tomorrow today please thanks answer question route number").split()
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city, by day",
        "parameters": {"type": "object", "required": ["city"], "properties": {
            "city": {"type": "string", "description": "The city's name, e.g. 東京"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "nullable": True},
            "days": {"type": "integer", "description": "How many days"}}}}},
    {"type": "function", "function": {
        "name": "search_flights", "description": "Flights between two places",
        "parameters": {"type": "object", "required": ["route"], "properties": {
            "route": {"type": "object", "description": "From where to where", "required": ["from"],
                      "properties": {"from": {"type": "string"}, "to": {"type": "string"}}},
            "stops": {"type": "array", "items": {"type": "string"}},
            "flexible": {"type": "boolean"}}}}},
    {"type": "function", "function": {"name": "get_time", "description": "The current time",
                                      "parameters": {"type": "object", "properties": {}}}},
]


def sentence(rnd, n):
    return " ".join(rnd.choice(WORDS) for _ in range(n)) + rnd.choice([".", "?", "!", ""])


def build(tmp):
    rnd = random.Random(1)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([sentence(rnd, 30) for _ in range(2000)] + [json.dumps(TOOLS)] * 20,
                            trainers.BpeTrainer(vocab_size=1500, show_progress=False,
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    d = tmp / FAMILY
    d.mkdir()
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 20, "bos_token": BOS,
        "eos_token": EOS, "pad_token": EOS}))
    (d / "chat_template.jinja").write_bytes((DATA / "chat_templates" / TEMPLATE).read_bytes())
    return d


def arguments(rnd, name):
    if name == "get_weather":
        return {"city": rnd.choice(["Paris", "東京"]), "days": rnd.randint(1, 7), "unit": "celsius"}
    if name == "search_flights":
        return {"route": {"from": "Paris", "to": "Tokyo"}, "stops": ["Dubai"] * rnd.randint(0, 2),
                "flexible": rnd.random() < 0.5}
    return {}


def conversation(rnd, i):
    msgs, tools = [], TOOLS if i % 3 != 2 else None
    if i % 2 == 0:
        msgs.append({"role": "system", "content": " " + sentence(rnd, 6) + "\n"})
    for r in range(1 + i % 3):
        if i % 5 == 1 and r == 0:
            msgs.append({"role": "user", "content": [{"type": "text", "text": sentence(rnd, 5)}]})
        else:
            msgs.append({"role": "user", "content": sentence(rnd, 4 + r)})
        # Kimi-K2's template queues tool-call ids with list.append, which transformers' immutable
        # sandbox refuses (SecurityError): its tools are declared, not called (tests/chat/
        # chat_template_test.cpp holds append / pop against Python's results).
        if tools and (i + r) % 2 == 0 and FAMILY != "kimi_k2":
            name = rnd.choice(["get_weather", "search_flights", "get_time"])
            msgs.append({"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": name, "arguments": arguments(rnd, name)}}]})
            result = {"temperature": rnd.randint(-5, 30), "sky": "clear"} if i % 2 else sentence(rnd, 3)
            if FAMILY == "gemma4":
                msgs.append({"role": "tool", "content": "",
                             "tool_responses": [{"name": name, "response": result}]})
            else:
                msgs.append({"role": "tool", "content": json.dumps(result) if i % 2 else result})
        answer = sentence(rnd, 8)
        if (i + r) % 4 == 1 and FAMILY == "gemma4":
            answer = f"<|channel>thought\n{sentence(rnd, 5)}<channel|>" + answer
        elif (i + r) % 4 == 1 and FAMILY == "minimax_m2":
            answer = f"<think>\n{sentence(rnd, 5)}\n</think>\n\n" + answer
        elif (i + r) % 4 in (1, 3) and FAMILY != "gemma4":
            msgs.append({"role": "assistant", "content": answer, "reasoning_content": sentence(rnd, 4)})
            continue
        msgs.append({"role": "assistant", "content": answer})
    return msgs, tools


def turn_spans(text, msgs, first):
    """Each assistant turn: from after its opener (and the opener's tail where the history has it:
    MiniMax's kept "<think>\\n") through its end-of-turn token (or the text's end)."""
    spans, at = [], 0
    while (at := text.find(OPENER, at)) != -1:
        begin = at + len(OPENER)
        if OPENER_TAIL and text.startswith(OPENER_TAIL, begin):
            begin += len(OPENER_TAIL)
        end = text.find(TURN_END, begin)
        end = len(text) if end == -1 else end + len(TURN_END)
        spans.append((begin, end))
        at = end
    return spans


def main():
    n = 24
    with tempfile.TemporaryDirectory() as d:
        tmp = pathlib.Path(d)
        tok_dir = build(tmp)
        tok = AutoTokenizer.from_pretrained(str(tok_dir))
        assert tok.chat_template == (DATA / "chat_templates" / TEMPLATE).read_text()
        rnd = random.Random(7)
        convs = [conversation(rnd, i) for i in range(n)]
        records = [dict({"messages": m}, **({"tools": t} if t else {})) for m, t in convs]
        docs, manifest = prepare_sft(BIN, records, tmp, tok_dir)
        assert len(docs) == n, len(docs)
        targets = compared = 0
        seen = {"tool calls": 0, "tool results": 0, "thinking stripped": 0, "thinking kept": 0, "system": 0,
                "list content": 0}
        for i, ((msgs, tools), (ids, mask)) in enumerate(zip(convs, docs)):
            want_ids, want_mask, text = reference(tok, msgs, tools, 0, turn_spans)
            assert list(ids) == want_ids, (i, tok.decode(list(ids)), text)
            check_mask(i, tok, ids, mask, want_mask, text)
            assert sum(want_mask) > 0
            targets += sum(want_mask)
            compared += len(want_ids)
            calls, results, thought = (("<|tool_call>call:", "<|tool_response>response:", "<|channel>")
                                       if FAMILY == "gemma4" else ("<invoke name=", "<response>", "<think>")
                                       if FAMILY == "minimax_m2" else
                                       ("<|tool_call_begin|>", "## Return of", "<think>"))
            seen["tool calls"] += calls in text
            seen["tool results"] += results in text
            seen["thinking stripped"] += any(m.get("reasoning_content") and m["reasoning_content"] not in text
                                             for m in msgs) or any(
                thought in str(m["content"]) or m.get("reasoning_content")
                                             for m in msgs) and text.count(thought) < sum(
                thought in str(m["content"]) or bool(m.get("reasoning_content")) for m in msgs)
            seen["thinking kept"] += FAMILY == "gemma4" or any(
                m.get("reasoning_content") and f"<think>{m['reasoning_content']}</think>" in text for m in msgs
            ) or "\n</think>" in text
            seen["system"] += any(m["role"] == "system" for m in msgs)
            seen["list content"] += any(isinstance(m["content"], list) for m in msgs)
        assert manifest["target_tokens"] == targets, (manifest["target_tokens"], targets)
        if FAMILY == "kimi_k2":
            seen = {k: v for k, v in seen.items() if not k.startswith("tool")}
        assert all(seen.values()), seen
        print(f"{FAMILY}: {n} conversations ({seen}): ids equal apply_chat_template ({compared} tokens), "
              f"masks equal the assistant turns ({targets} target tokens)")
    print("ok")


main()
