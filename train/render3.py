"""The Needle 3 (cactus-needle 3.x) chat template for training examples, standard library
only, so data tools and tests run without the official package.

An example is the official fine-tuning record: `query`, `tools` (a list of schemas or
their JSON text), `answers` (or `function_calls`: the list of calls, or its JSON text),
and optionally `system` and `reasoning`. It renders as two texts that are tokenized
separately (the loss covers the target and EOS only):

    prompt  [<|im_start|>system\\nSYSTEM<|im_end|>\\n]
            <|im_start|>user\\n<tools>TOOLS</tools>\\nQUERY<|im_end|>\\n<|im_start|>assistant\\n
    target  [<think>\\nREASONING\\n</think>\\n]<tool_call>ANSWERS</tool_call><|im_end|>

TOOLS and ANSWERS are compact JSON (no spaces after , and :) with non-ASCII characters
written as themselves; the system and reasoning blocks appear only when their stripped
text is not empty. The engine builds the same prompt at inference (src/agent/prompt.c:
prompt_prefix_ids writes the system block, then the user turn up to </tools>), and
tests/parity/test_render3.py checks this renderer against the official one byte for byte.

    python train/render3.py DATA.jsonl [--limit N]   # prints prompt and target of each
"""
import argparse
import json

MARKERS = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tools>", "</tools>",
           "<tool_call>", "</tool_call>", "<tool_result>", "</tool_result>", "<context>",
           "</context>", "<extract>", "</extract>", "<schema>", "</schema>"]
PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3


def compact_json(value):
    """Text kept as given; anything else in Python's compact JSON with UTF-8 as is."""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def render(example):
    """(prompt, target) texts of one example in the 3.x template."""
    tools = compact_json(example.get("tools", []))
    calls = example["answers"] if "answers" in example else example.get("function_calls", [])
    calls = compact_json(calls)
    system = (example.get("system") or "").strip()
    reasoning = (example.get("reasoning") or "").strip()
    prompt = ""
    if system:
        prompt += "<|im_start|>system\n" + system + "<|im_end|>\n"
    prompt += ("<|im_start|>user\n<tools>" + tools + "</tools>\n" + example["query"]
               + "<|im_end|>\n<|im_start|>assistant\n")
    target = ""
    if reasoning:
        target += "<think>\n" + reasoning + "\n</think>\n"
    target += "<tool_call>" + calls + "</tool_call><|im_end|>"
    return prompt, target


def encode(encode_text, example, max_len=None):
    """Token ids and loss mask of one example: BOS, the prompt's ids (mask 0), the target's
    ids and EOS (mask 1); cut to max_len when given (no padding). `encode_text` maps a text
    to its ids (a SentencePiece processor's `encode`, or needle's tokenizer)."""
    prompt, target = render(example)
    p, t = encode_text(prompt), encode_text(target)
    ids = [BOS_ID] + list(p) + list(t) + [EOS_ID]
    mask = [0] * (1 + len(p)) + [1] * (len(t) + 1)
    if max_len is not None:
        ids, mask = ids[:max_len], mask[:max_len]
    return ids, mask


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data")
    ap.add_argument("--limit", type=int, default=3)
    a = ap.parse_args()
    with open(a.data, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= a.limit:
                break
            prompt, target = render(json.loads(line))
            print(prompt + target)


if __name__ == "__main__":
    main()
