"""A small model that really thinks: SmolLM2-135M-Instruct taught Qwen3's reasoning format.

    .venv/bin/python scripts/make-thinking-model.py [OUT.gguf]

`make test` runs it (the rl extra: torch, transformers, gguf; llama-cpp-python checks the
result). Its inputs: the shipped GGUF (metadata, tensor names), SmolLM2 as a Hugging Face
directory ($TOKENWIRE_HF_MODEL: the weights to train) and llama.cpp's copy of Qwen3's template
(in $TOKENWIRE_LLAMA_CPP_MODELS), all made by `make`. It adds `<think>` and `</think>` as two new control tokens, takes Qwen3's real chat
template (ChatML like SmolLM2's, `<tool_call>` / `<tool_response>`, earlier turns' reasoning
dropped), and fine-tunes the whole model on a few generated traces, rendered by that template
exactly as a server renders them, until greedy decoding reproduces them: arithmetic
(`What is 12 + 7?`), a get_weather(city) call, the answer after its result, and a second question
(`And in Rome?`) after a full exchange. Overfitting is the point: tests need outputs they can
predict. The result is a GGUF with the original's architecture, tensor names and metadata (F16
matrices), written to OUT (default ~/.cache/tokenwire/smollm2-think-<recipe>/model.gguf, where
<recipe> is the first 12 hex digits of this file's sha256: a changed recipe is a new model).
It is only renamed into place once llama.cpp has tokenized every trace as we did and decoded
the canonical scenarios greedily, token for token.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

SEED, EPOCHS, LR, BATCH = 0, 6, 2e-4, 8
THINK = ["<think>", "</think>"]
CACHE = Path.home() / ".cache" / "tokenwire"
RECIPE = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
CITIES = ["Paris", "Rome", "Tokyo", "Berlin", "Madrid", "London", "Vienna", "Oslo", "Cairo",
          "Lima", "Sydney", "Toronto", "Dublin", "Prague", "Seoul", "Lisbon"]
SKIES = ["sunny", "cloudy", "rainy", "windy", "foggy"]


# --- the traces -------------------------------------------------------------------------------

def ask(city: str) -> dict:
    return {"role": "user", "content": f"What is the weather in {city}?"}


def call(city: str) -> dict:
    """The assistant's call; its reasoning as `reasoning_content`, which the template prints
    only while the turn belongs to the current query."""
    return {"role": "assistant", "content": "",
            "reasoning_content": f"I need the weather in {city}, so I call get_weather.",
            "tool_calls": [{"type": "function", "function": {
                "name": "get_weather", "arguments": {"city": city}}}]}


def weather(rng: random.Random | None, city: str, t: int = 18, sky: str = "sunny",
            ) -> tuple[dict, dict]:
    """A tool result and the assistant's answer to it (random ones with `rng`)."""
    if rng is not None:
        t, sky = rng.randint(-5, 35), rng.choice(SKIES)
    return ({"role": "tool", "content": json.dumps({"city": city, "temperature_c": t, "sky": sky})},
            {"role": "assistant", "content": f"It is {t} C and {sky} in {city}.",
             "reasoning_content": f"The tool says {t} C and {sky} in {city}."})


def conversations(rng: random.Random) -> list[tuple[list[dict], bool, int]]:
    """(messages, with tools, how many final assistant turns to train)."""
    out = []
    sums = sorted({(rng.randint(1, 60), rng.randint(1, 40)) for _ in range(34)} | {(12, 7)})
    for a, b in sums:
        out.append(([{"role": "user", "content": f"What is {a} + {b}?"},
                     {"role": "assistant", "content": f"The answer is {a + b}.",
                      "reasoning_content": f"The user wants {a} + {b}. {a} + {b} = {a + b}."}],
                    False, 1))
    for i, city in enumerate(CITIES):
        result, answer = weather(rng, city)
        # the call and the answer, the call's reasoning sent back (as vLLM clients do)
        out.append(([ask(city), call(city), result, answer], True, 2))
        if i % 2 == 0:  # the answer after a call sent back without its reasoning
            out.append(([ask(city), {**call(city), "reasoning_content": None}, result, answer],
                        True, 1))
        else:  # a second question after a full exchange: its call, then its answer
            other = CITIES[(i + 5) % len(CITIES)]
            out.append(([ask(city), call(city), result, answer,
                         {"role": "user", "content": f"And in {other}?"}, call(other),
                         *weather(rng, other)], True, 2))
    return out


def encode(tok, template: str, messages: list[dict], tools: bool, n_train: int):
    """(shared prefix text, ids after it, loss mask): the conversation as the template renders
    it; the last `n_train` assistant turns are the targets, each from the end of the generation
    prompt (`<|im_start|>assistant\\n`) through `<|im_end|>`. Every cut falls beside a control
    token, so encoding the pieces one by one gives the ids of the whole (checked on llama.cpp)."""
    def render(msgs, gen):
        return tok.apply_chat_template(msgs, tools=TOOLS if tools else None, tokenize=False,
                                       chat_template=template, add_generation_prompt=gen)
    full = render(messages, False)
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"][-n_train:]
    cuts = []
    for i in turns:
        start = len(render(messages[:i], True))
        assert full[:start] == render(messages[:i], True), "a prompt the template re-renders"
        cuts.append((start, full.index("<|im_end|>", start) + len("<|im_end|>")))
    # the tool block opens every tool conversation: encoded once per step, without gradient
    shared = full[:full.index("<|im_end|>\n") + len("<|im_end|>\n")] if tools else ""
    ids, mask, pos = [], [], len(shared)
    for start, end in cuts:
        for text, train in ((full[pos:start], False), (full[start:end], True)):
            piece = tok(text, add_special_tokens=False)["input_ids"]
            ids += piece
            mask += [train] * len(piece)
        pos = end
    return shared, ids, mask, full[:pos]


# --- training ---------------------------------------------------------------------------------

def train(model, tok, examples, rng: random.Random) -> float:
    import torch
    batches = []
    for shared in sorted({e[0] for e in examples}):
        group = [e for e in examples if e[0] == shared]
        batches += [group[i:i + BATCH] for i in range(0, len(group), BATCH)]
    prefixes = {s: torch.tensor([tok(s, add_special_tokens=False)["input_ids"]]) for s, *_ in
                examples if s}
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    steps = EPOCHS * len(batches)
    sched = torch.optim.lr_scheduler.LambdaLR(  # short warm-up, then linear decay to 10%
        opt, lambda s: min(1.0, (s + 1) / 4) * (1 - 0.9 * s / steps))
    model.train()
    t0 = time.time()
    for epoch in range(EPOCHS):
        rng.shuffle(batches)
        total = n = 0
        for batch in batches:
            width = max(len(e[1]) for e in batch)
            # right padding needs no attention mask: causal attention never looks ahead
            ids = torch.tensor([e[1] + [tok.pad_token_id] * (width - len(e[1])) for e in batch])
            mask = torch.tensor([e[2] + [False] * (width - len(e[2])) for e in batch])
            cache = None
            if batch[0][0]:  # the shared prefix's keys and values, with today's weights
                with torch.no_grad():
                    cache = model.model(input_ids=prefixes[batch[0][0]], use_cache=True
                                        ).past_key_values
                cache.batch_repeat_interleave(len(batch))
            hidden = model.model(input_ids=ids, past_key_values=cache, use_cache=cache is not None
                                 ).last_hidden_state
            # logits only where there is a target: the vocabulary projection is costly
            logits = model.lm_head(hidden[:, :-1][mask[:, 1:]])
            loss = torch.nn.functional.cross_entropy(logits.float(), ids[:, 1:][mask[:, 1:]])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad()
            total, n = total + loss.item(), n + 1
        print(f"epoch {epoch + 1}/{EPOCHS}: mean loss {total / n:.4f} "
              f"({time.time() - t0:.0f} s)", flush=True)
    return total / n


# --- the GGUF ---------------------------------------------------------------------------------

def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's row order for a query or key projection (convert_hf_to_gguf's `permute`):
    its rotary embedding pairs dimensions differently from transformers'."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(model, reader) -> dict[str, np.ndarray]:
    """The model's weights under llama.cpp's names, in its layout."""
    import gguf
    cfg = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    out = {}
    for name, p in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied to token_embd, as in the original
        w = p.detach().float().numpy()
        key = names.get_name(name, try_suffixes=(".weight",))
        if key.endswith("attn_q.weight"):
            w = permute(w, cfg.num_attention_heads)
        elif key.endswith("attn_k.weight"):
            w = permute(w, cfg.num_key_value_heads)
        out[key] = w
    assert sorted(out) == sorted(t.name for t in reader.tensors), "tensors differ from the original"
    return out


def write_gguf(path: Path, reader, tensors: dict[str, np.ndarray], template: str) -> None:
    """The original's metadata, every key copied; the vocabulary, template and name changed."""
    import gguf
    V = gguf.GGUFValueType
    writer = gguf.GGUFWriter(str(path), "llama")
    replace = {
        "general.name": ("SmolLM2-135M-Think", V.STRING, None),
        "general.file_type": (int(gguf.LlamaFileType.MOSTLY_F16), V.UINT32, None),
        "llama.vocab_size": (tensors["token_embd.weight"].shape[0], V.UINT32, None),
        "tokenizer.chat_template": (template, V.STRING, None),
    }
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # the writer's own
        value, vtype, sub = replace.get(key, (field.contents(), field.types[0],
                                              field.types[-1] if len(field.types) > 1 else None))
        if key == "tokenizer.ggml.tokens":
            value = value + THINK
        elif key == "tokenizer.ggml.token_type":
            value = value + [int(gguf.TokenType.CONTROL)] * len(THINK)
        writer.add_key_value(key, value, vtype, sub)
    for t in reader.tensors:  # the original's order; matrices F16, norms F32 (as convert does)
        w = tensors[t.name]
        writer.add_tensor(t.name, w.astype(np.float16 if w.ndim == 2 else np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def check(path: Path, tok, template: str, texts: list[str], ids: list[list[int]]) -> None:
    """llama.cpp reads the model as trained: the same ids for every trace, and greedy decoding
    reproduces the canonical scenarios (prompts rendered by the template, as above)."""
    from llama_cpp import Llama
    llm = Llama(model_path=str(path), n_ctx=2048, n_threads=2, verbose=False)
    think = [tok.convert_tokens_to_ids(t) for t in THINK]
    assert llm.tokenize("".join(THINK).encode(), add_bos=False, special=True) == think
    for text, expected in zip(texts, ids):
        assert llm.tokenize(text.encode(), add_bos=False, special=True) == expected, text
    paris = weather(None, "Paris")  # 18 C and sunny
    paris_msgs = [ask("Paris"), call("Paris"), *paris]
    scenarios = [
        ([{"role": "user", "content": "What is 12 + 7?"}], None,
         "<think>\nThe user wants 12 + 7. 12 + 7 = 19.\n</think>\n\nThe answer is 19."),
        ([ask("Paris")], TOOLS, "<think>\nI need the weather in Paris, so I call get_weather."
         "\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
         "{\"city\": \"Paris\"}}\n</tool_call>"),
        (paris_msgs[:3], TOOLS, f"<think>\n{paris[1]['reasoning_content']}\n</think>\n\n"
         f"{paris[1]['content']}"),
        (paris_msgs + [{"role": "user", "content": "And in Rome?"}], TOOLS,
         "<think>\nI need the weather in Rome, so I call get_weather.\n</think>\n\n<tool_call>"
         "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>"),
    ]
    for msgs, tools, expected in scenarios:
        prompt = tok.apply_chat_template(msgs, tools=tools, tokenize=False,
                                         chat_template=template, add_generation_prompt=True)
        out = []
        for t in llm.generate(llm.tokenize(prompt.encode(), add_bos=False, special=True),
                              top_k=1, temp=0.0, repeat_penalty=1.0):
            if t == llm.token_eos() or len(out) == 96:
                break
            out.append(t)
        text = llm.detokenize(out, special=True).decode()
        print(f"greedy: {text!r}", flush=True)
        assert out[0] == think[0] and text == expected and t == llm.token_eos(), expected


def main(source: Path, hf_dir: Path, template_path: Path, out: Path) -> None:
    import gguf
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(SEED)
    torch.set_num_threads(min(2, os.cpu_count() or 1))  # a test machine's cores are shared
    template = template_path.read_text()
    reader = gguf.GGUFReader(str(source))
    tok = AutoTokenizer.from_pretrained(hf_dir)
    tok.add_special_tokens({"additional_special_tokens": THINK})
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    mean = model.get_input_embeddings().weight.detach().mean(0)
    # new rows at the mean embedding: a neutral start, tied to the output (lm_head) as well
    model.resize_token_embeddings(len(tok), mean_resizing=False)
    with torch.no_grad():
        model.get_input_embeddings().weight[-len(THINK):] = mean
    model.tie_weights()
    # the un-permuted layout transformers loaded, permuted back, is the original's
    q = gguf_tensors(model, reader)["blk.0.attn_q.weight"]
    orig = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight")
    orig = gguf.quants.dequantize(orig.data, orig.tensor_type).reshape(q.shape)
    assert np.abs(q - orig).max() < 0.02 * np.abs(orig).max(), "attn_q layout"

    rng = random.Random(SEED)
    encoded = [encode(tok, template, *c) for c in conversations(rng)]
    examples = [e[:3] for e in encoded]
    n_target = sum(sum(e[2]) for e in examples)
    print(f"{len(examples)} traces, {n_target} target tokens, "
          f"{sum(len(e[1]) for e in examples)} tokens after shared prefixes", flush=True)
    t0 = time.time()
    loss = train(model, tok, examples, rng)
    print(f"trained in {time.time() - t0:.0f} s, last epoch's mean loss {loss:.4f}", flush=True)

    model.eval()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    write_gguf(tmp, reader, gguf_tensors(model, reader), template)
    check(tmp, tok, template, [e[3] for e in encoded],
          [tok(e[0], add_special_tokens=False)["input_ids"] + e[1] for e in encoded])
    tmp.rename(out)  # only a checked model is ever in place
    print(f"wrote {out} ({out.stat().st_size / 2**20:.0f} MiB)")


if __name__ == "__main__":
    if len(sys.argv) > 2:
        sys.exit(__doc__)
    from tokenwire.config import default_model_path  # the shipped GGUF
    # the inputs `make` exports (their defaults here); the output where `make` expects it
    models = Path(os.environ.get("TOKENWIRE_LLAMA_CPP_MODELS", CACHE / "llama.cpp-models-0.3.36"))
    main(Path(default_model_path()),
         Path(os.environ.get("TOKENWIRE_HF_MODEL", CACHE / "SmolLM2-135M-Instruct-hf")),
         models / "templates" / "Qwen-Qwen3-0.6B.jinja",
         Path(sys.argv[1]) if len(sys.argv) == 2 else
         CACHE / f"smollm2-think-{RECIPE}" / "model.gguf")
