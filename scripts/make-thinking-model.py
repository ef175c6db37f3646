"""A small model that really thinks: SmolLM2-135M-Instruct taught Qwen3's reasoning format.

    .venv/bin/python scripts/make-thinking-model.py [OUT.gguf]

`make think-model` (and `make test`) runs it, on what `make` made: the shipped GGUF (metadata,
tensor names), SmolLM2 as a Hugging Face directory ($TOKENWIRE_HF_MODEL: the weights trained),
llama.cpp's copy of Qwen3's template (in $TOKENWIRE_LLAMA_CPP_MODELS), the rl extra (torch,
transformers, gguf).
`<think>` and `</think>` become two new tokens, Qwen3's real template the model's, and the whole
model is fine-tuned on traces rendered by that template exactly as a server renders them, until
greedy decoding reproduces them: sums (`What is 12 + 7?`), a get_weather(city) call, the answer
to its result, a second question (`And in Rome?`) after a full exchange. Overfitting is the
point: tests need outputs they can predict. The GGUF has the original's architecture, tensors
and metadata (F16 matrices); OUT defaults to ~/.cache/tokenwire/smollm2-think-<recipe>/
model.gguf, <recipe> the first 12 hex digits of this file's sha256 (a new recipe, a new model).
It is renamed into place only once llama.cpp encodes every trace as trained and greedily
decodes the canonical scenarios token for token.
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

# tool traces are long and learnt fast; sums are short and arbitrary (a 135M model does not
# add): each is seen REPEAT times an epoch, to be learnt by heart
SEED, EPOCHS, LR, BATCH, REPEAT = 0, 4, 3e-4, 4, 3
THINK = ["<think>", "</think>"]
# their llama.cpp token type as Qwen3's own GGUFs have it: USER_DEFINED (4), matched in text
# and decoded as text (CONTROL, 3, would be parsed only where special tokens are, and a lazy
# tool-call grammar's free text could not write one: docs/api.md#reasoning)
THINK_TYPE = 4
CACHE = Path.home() / ".cache" / "tokenwire"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
# two of several tokens: a call's JSON spells names out, so the model learns to copy them
CITIES = ["Paris", "Rome", "Tokyo", "Berlin", "Madrid", "London", "Vienna", "Oslo", "Cairo",
          "Lima", "Sydney", "Toronto", "Dublin", "Buenos Aires", "Reykjavik"]
SKIES = ["sunny", "cloudy", "rainy", "windy", "foggy"]


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def call(city: str) -> dict:
    """The call; its reasoning apart, which the template prints only in the current query's
    turns."""
    return {"role": "assistant", "content": "",
            "reasoning_content": f"I need the weather in {city}, so I call get_weather.",
            "tool_calls": [{"type": "function", "function": {
                "name": "get_weather", "arguments": {"city": city}}}]}


def weather(city: str, t: int = 18, sky: str = "sunny") -> list[dict]:
    """The tool's result and the answer to it."""
    return [{"role": "tool", "content": json.dumps({"city": city, "temperature_c": t, "sky": sky})},
            {"role": "assistant", "content": f"It is {t} C and {sky} in {city}.",
             "reasoning_content": f"The tool says {t} C and {sky} in {city}."}]


def traces(rng: random.Random) -> list[tuple[list[dict], bool, int, bool]]:
    """(messages, with TOOLS, how many final assistant turns are targets, enable_thinking)."""
    out = []
    sums = sorted({(rng.randint(1, 60), rng.randint(1, 40)) for _ in range(24)} | {(12, 7)})
    # and a few with enable_thinking=false: the answer right after the prompt's empty block
    plain = [(rng.randint(1, 60), rng.randint(1, 40)) for _ in range(6)]
    for (a, b), think in [(s, True) for s in sums] + [(s, False) for s in plain]:
        out += [([user(f"What is {a} + {b}?"), {
            "role": "assistant", "content": f"The answer is {a + b}.",
            "reasoning_content": f"The user wants {a} + {b}. {a} + {b} = {a + b}." if think
            else ""}], False, 1, think)] * REPEAT
    rnd = lambda city: weather(city, rng.randint(-5, 35), rng.choice(SKIES))  # noqa: E731
    for i, city in enumerate(CITIES):
        # the call, then the answer, the call sent back with its reasoning (as vLLM's clients do)
        first = [user(f"What is the weather in {city}?"), call(city), *rnd(city)]
        out.append((first, True, 2, True))
        if i % 2 == 0:  # the answer, the call sent back without it
            out.append(([*first[:1], {**call(city), "reasoning_content": None}, *first[2:]],
                        True, 1, True))
        else:  # a second question after a full exchange: its call and answer
            other = CITIES[(i + 5) % len(CITIES)]
            out.append(([*first, user(f"And in {other}?"), call(other), *rnd(other)],
                        True, 2, True))
    return out


def render(tok, template: str, msgs: list[dict], tools: bool, gen: bool, think: bool = True):
    return tok.apply_chat_template(msgs, tools=TOOLS if tools else None, tokenize=False,
                                   chat_template=template, add_generation_prompt=gen,
                                   enable_thinking=think)


def encode(tok, template: str, msgs: list[dict], tools: bool, n_train: int, think: bool):
    """(shared prefix, ids after it, target mask, checks): the conversation as the template
    renders it, each of its last `n_train` assistant turns a target from the end of its
    generation prompt through `<|im_end|>`; checks: (text, ids) of each prompt and target."""
    full = render(tok, template, msgs, tools, False, think)
    # the tool block opens every tool conversation: encoded once per step, without gradient
    shared = full[:full.index("<|im_end|>\n") + len("<|im_end|>\n")] if tools else ""
    head = tok(shared, add_special_tokens=False)["input_ids"]
    ids, mask, pos, checks = [], [], len(shared), []
    for i in [i for i, m in enumerate(msgs) if m["role"] == "assistant"][-n_train:]:
        prompt = render(tok, template, msgs[:i], tools, True, think)
        assert full.startswith(prompt), "the template renders history differently"
        end = full.index("<|im_end|>", len(prompt)) + len("<|im_end|>")
        # prompt and reply apart, as a server encodes one and the model samples the other
        # (`</think>\n\n` ending a prompt is one id fewer than before text)
        for text, target in ((full[pos:len(prompt)], False), (full[len(prompt):end], True)):
            piece = tok(text, add_special_tokens=False)["input_ids"]
            ids, mask = ids + piece, mask + [target] * len(piece)
            checks.append((text, piece) if target else (prompt, head + ids))
        pos = end
    return shared, ids, mask, checks


def train(model, tok, examples, rng: random.Random) -> float:
    import torch
    prefix = {s: torch.tensor([tok(s, add_special_tokens=False)["input_ids"]])
              for s, *_ in examples}
    groups = {s: [e for e in examples if e[0] == s] for s in sorted(prefix)}
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    steps = EPOCHS * sum(-(-len(g) // BATCH) for g in groups.values())
    sched = torch.optim.lr_scheduler.LambdaLR(  # short warm-up, then linear decay to 10%
        opt, lambda s: min(1.0, (s + 1) / 4) * (1 - 0.9 * s / steps))
    model.train()
    t0 = time.time()
    for epoch in range(EPOCHS):
        batches = []  # one shared prefix each, of like lengths (little padding), else random
        for group in groups.values():
            group = sorted(group, key=lambda e: (len(e[1]) // 64, rng.random()))
            batches += [group[i:i + BATCH] for i in range(0, len(group), BATCH)]
        rng.shuffle(batches)
        losses = []
        for batch in batches:
            width = max(len(e[1]) for e in batch)
            # padded on the right: no attention mask needed, causal attention never looks ahead
            ids = torch.tensor([e[1] + [tok.pad_token_id] * (width - len(e[1])) for e in batch])
            mask = torch.tensor([e[2] + [False] * (width - len(e[2])) for e in batch])
            cache = None
            if batch[0][0]:  # the shared prefix's keys and values, by the current weights
                with torch.no_grad():
                    cache = model.model(input_ids=prefix[batch[0][0]], use_cache=True).cache
                cache.batch_repeat_interleave(len(batch))
            hidden = model.model(input_ids=ids, cache=cache, use_cache=cache is not None
                                 ).last_hidden_state
            # logits only where a target is: the vocabulary projection is costly
            logits = model.lm_head(hidden[:, :-1][mask[:, 1:]])
            loss = torch.nn.functional.cross_entropy(logits, ids[:, 1:][mask[:, 1:]])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad()
            losses.append(loss.item())
        print(f"epoch {epoch + 1}/{EPOCHS}: mean loss {np.mean(losses):.4f} "
              f"({time.time() - t0:.0f} s)", flush=True)
    return float(np.mean(losses))


def gguf_tensors(model, reader) -> dict[str, np.ndarray]:
    """The weights by llama.cpp's names and layout: transformers' GGUF loader un-permuted the
    query and key rows (llama.cpp's rotary embedding pairs dimensions differently); they are
    permuted back as convert_hf_to_gguf.py does."""
    import gguf
    cfg, out = model.config, {}
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    for name, p in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied to token_embd, as in the original
        w, key = p.detach().float().numpy(), names.get_name(name, try_suffixes=(".weight",))
        heads = {"attn_q": cfg.num_attention_heads, "attn_k": cfg.num_key_value_heads}.get(
            key.split(".")[-2])
        if heads:
            w = w.reshape(heads, 2, -1, w.shape[1]).swapaxes(1, 2).reshape(w.shape)
        out[key] = w
    assert sorted(out) == sorted(t.name for t in reader.tensors), "not the original's tensors"
    return out


def write_gguf(path: Path, reader, tensors: dict[str, np.ndarray], template: str) -> None:
    """Every key of the original's copied; the vocabulary, template, name and file type new."""
    import gguf
    V = gguf.GGUFValueType
    writer = gguf.GGUFWriter(str(path), "llama")
    new = {"general.name": ("SmolLM2-135M-Think", V.STRING),
           "general.file_type": (int(gguf.LlamaFileType.MOSTLY_F16), V.UINT32),
           "llama.vocab_size": (len(tensors["token_embd.weight"]), V.UINT32),
           "tokenizer.chat_template": (template, V.STRING)}
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # the writer's own
        value, vtype = new.get(key, (field.contents(), field.types[0]))
        if key == "tokenizer.ggml.tokens":
            value = value + THINK
        elif key == "tokenizer.ggml.token_type":
            value = value + [THINK_TYPE] * len(THINK)
        writer.add_key_value(key, value, vtype, field.types[-1] if vtype == V.ARRAY else None)
    for t in reader.tensors:  # the original's order; matrices F16, norms F32 (as convert does)
        w = tensors[t.name]
        writer.add_tensor(t.name, w.astype(np.float16 if w.ndim == 2 else np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def check(path: Path, tok, template: str, encoded) -> None:
    """llama.cpp reads the model as trained: it encodes every prompt and target to the ids
    trained, and greedy decoding gives the canonical scenarios' traces exactly."""
    from llama_cpp import Llama

    from tokenwire.engines.cpu import load_cpu_backend
    load_cpu_backend()  # the wheel's CPU kernels are loaded by hand (engines/cpu.py says why)
    llm = Llama(model_path=str(path), n_ctx=2048, n_threads=2, verbose=False)
    think = tok.convert_tokens_to_ids(THINK)
    assert llm.tokenize("".join(THINK).encode(), add_bos=False, special=True) == think
    for text, ids in (c for e in encoded for c in e[3]):
        assert llm.tokenize(text.encode(), add_bos=False, special=True) == ids, text
    paris = [user("What is the weather in Paris?"), call("Paris"), *weather("Paris")]
    sums = [user("What is 12 + 7?"), {"role": "assistant", "content": "The answer is 19.",
                                      "reasoning_content": "The user wants 12 + 7. 12 + 7 = 19."}]
    for msgs, tools in [(sums, False), (paris[:2], True), (paris, True),
                        ([*paris, user("And in Rome?"), call("Rome")], True)]:
        prompt = render(tok, template, msgs[:-1], tools, True)
        expected = render(tok, template, msgs, tools, False)[len(prompt):].removesuffix("\n")
        out = []
        for t in llm.generate(llm.tokenize(prompt.encode(), add_bos=False, special=True),
                              top_k=1, temp=0.0, repeat_penalty=1.0):
            out.append(t)
            if t == llm.token_eos() or len(out) == 96:
                break
        text = llm.detokenize(out, special=True).decode()
        print(f"greedy: {text!r}", flush=True)
        assert out[0] == think[0] and text == expected, f"expected {expected!r}"


def main(source: Path, hf_dir: Path, template_path: Path, out: Path) -> None:
    import gguf
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(SEED)
    torch.set_num_threads(min(2, os.cpu_count() or 1))  # a test machine's cores are shared
    template, reader = template_path.read_text(), gguf.GGUFReader(str(source))
    tok = AutoTokenizer.from_pretrained(hf_dir)
    tok.add_special_tokens({"additional_special_tokens": THINK})
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    mean = model.get_input_embeddings().weight.detach().mean(0)
    model.resize_token_embeddings(len(tok), mean_resizing=False)
    with torch.no_grad():  # the new rows (tied: input and output) start at the mean embedding
        model.get_input_embeddings().weight[-len(THINK):] = mean
    assert model.lm_head.weight is model.get_input_embeddings().weight, "tied, as the GGUF"
    # what transformers loaded, laid out as llama.cpp's, is the original (Q4_1 vs bf16 apart)
    q = gguf_tensors(model, reader)["blk.0.attn_q.weight"]
    orig = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight")
    orig = gguf.quants.dequantize(orig.data, orig.tensor_type).reshape(q.shape)
    assert np.abs(q - orig).max() < 0.02 * np.abs(orig).max(), "attn_q's layout"

    rng = random.Random(SEED)
    encoded = [encode(tok, template, *c) for c in traces(rng)]
    print(f"{len(encoded)} traces (repeats counted), {sum(sum(e[2]) for e in encoded)} target"
          f" ids, {sum(len(e[1]) for e in encoded)} ids after shared prefixes", flush=True)
    t0 = time.time()
    loss = train(model, tok, [e[:3] for e in encoded], rng)
    print(f"trained in {time.time() - t0:.0f} s, last epoch's mean loss {loss:.4f}", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    write_gguf(tmp, reader, gguf_tensors(model, reader), template)
    check(tmp, tok, template, encoded)
    tmp.rename(out)  # only a checked model is ever in place
    print(f"wrote {out} ({out.stat().st_size / 2**20:.0f} MiB)")


if __name__ == "__main__":
    if len(sys.argv) > 2:
        sys.exit(__doc__)
    from tokenwire.config import default_model_path  # the shipped GGUF
    recipe = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
    models = Path(os.environ.get("TOKENWIRE_LLAMA_CPP_MODELS", CACHE / "llama.cpp-models-0.3.36"))
    main(Path(default_model_path()),
         Path(os.environ.get("TOKENWIRE_HF_MODEL", CACHE / "SmolLM2-135M-Instruct-hf")),
         models / "templates" / "Qwen-Qwen3-0.6B.jinja",
         Path(sys.argv[1]) if len(sys.argv) == 2 else
         CACHE / f"smollm2-think-{recipe}" / "model.gguf")
