"""Tool calls by family, on ids, with each family's real chat template and a real vocabulary
from llama.cpp's test files: the template writes an assistant turn's calls, the format found in
the template reads them back from the ids (one id at a time, as a stream sees them), and gets the
same names and arguments, no content, and every id exactly once.

llama.cpp's vocabulary files lack most families' tool markers (its Llama 3 file is 3.0's, without
`<|python_tag|>`; the Llama 2 file stands in for Mistral's; Qwen2's has `[PAD…]` where Qwen's and
DeepSeek's markers belong), so each family's markers are put in at its ids (tests/ggufmodels.py),
as control tokens where the family has them so: what the model samples and the template writes
is then one id per marker, as with the real vocabularies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.ggufmodels import (
    HERMES3_MARKERS,
    LLAMA31_MARKERS,
    MISTRAL_MARKERS,
    MISTRAL_V11_MARKERS,
    QWEN_MARKERS,
    R1_MARKERS,
    qwen35_vocabulary,
    tiny_model,
)
from tokenwire.engines.base import TokenEvent
from tokenwire.serving.output import OutputDecoder
from tokenwire.serving.template import ChatTemplate, TemplateMessage
from tokenwire.serving.toolcalls import FORMATS, PARSERS, tool_format
from tokenwire.serving.toolcalls.qwen3_xml import QWEN3_XML
from tokenwire.tokenizers.gguf import tokenizer_from_gguf

CALLS = [("get_weather", {"city": "Paris", "unit": "celsius"}),
         ("get_time", {"zone": "Europe/Paris", "fmt": "24h \"quoted\" — ünïcode"})]
TOOLS = [{"type": "function", "function": {
    "name": name, "description": "d", "parameters": {
        "type": "object", "properties": {k: {"type": "string"} for k in args}}}}
    for name, args in CALLS]
ENDS = ("<|eot_id|>", "<|eom_id|>", "</s>", "<｜end▁of▁sentence｜>", "<|im_end|>")

# (template, llama.cpp vocabulary, its markers, the format the template writes, parallel calls)
CASES = [
    ("Qwen-Qwen2.5-7B-Instruct.jinja", "qwen2", QWEN_MARKERS, "hermes", True),
    ("Qwen-Qwen3-0.6B.jinja", "qwen2", QWEN_MARKERS, "hermes", True),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "llama-bpe", HERMES3_MARKERS,
     "hermes", True),
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", "llama-bpe", LLAMA31_MARKERS, "llama3_json",
     False),
    ("meta-llama-Llama-3.3-70B-Instruct.jinja", "llama-bpe", LLAMA31_MARKERS, "llama3_json",
     False),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "llama-spm", MISTRAL_MARKERS, "mistral",
     True),
    ("Mistral-Small-3.2-24B-Instruct-2506.jinja", "llama-spm", MISTRAL_V11_MARKERS, "mistral",
     True),
    ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", "llama-spm", MISTRAL_V11_MARKERS,
     "mistral", True),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "qwen2", R1_MARKERS, "deepseek_v3", True),
    ("llama-cpp-deepseek-r1.jinja", "qwen2", R1_MARKERS, "deepseek_v3", True),
    ("deepseek-ai-DeepSeek-V3.1.jinja", "qwen2", R1_MARKERS, "deepseek_v31", True),
    ("Qwen3.5-4B.jinja", "qwen35", {}, "qwen3_coder", True),
    ("Qwen3-Coder.jinja", "qwen2", QWEN_MARKERS, "qwen3_coder", True),
]


def _turn(template: ChatTemplate, tok: Any, calls: list[tuple[str, dict[str, Any]]]
          ) -> list[int]:
    """The ids the template writes for an assistant turn of `calls` (after the prompt, up to
    its end of turn)."""
    user = TemplateMessage("user", [], text="Weather and time in Paris?")
    tool_calls = [{"id": f"call{k:05d}", "type": "function",
                   "function": {"name": n, "arguments": a}} for k, (n, a) in enumerate(calls)]
    whole = template.render([user, TemplateMessage("assistant", [], text="",
                                                   tool_calls=tool_calls)],
                            add_generation_prompt=False, tools=TOOLS).ids
    prompt = template.render([user], add_generation_prompt=True, tools=TOOLS).ids
    k = 0
    while k < min(len(whole), len(prompt)) and whole[k] == prompt[k]:
        k += 1
    turn, ends, text = whole[k:], [], b""
    for i in turn:
        text += tok.token_bytes(i)
        ends.append(len(text))
    cut = min((text.find(e.encode()) for e in ENDS if e.encode() in text), default=len(text))
    return [i for i, end in zip(turn, ends, strict=True) if end <= cut]


def _parse(fmt: Any, tok: Any, ids: list[int]) -> tuple[str, list[tuple[str, Any]], list[int]]:
    decoder, parser = OutputDecoder(tok), fmt.parser()
    content, out = "", []
    for i in ids:
        d = parser.push(decoder.push(TokenEvent(i, None)))
        content, out = content + d.content, out + d.ids
    d = parser.push(decoder.finish(), last=True)
    content, out = content + d.content, out + d.ids
    return content, [(c.name, json.loads(c.arguments)) for c in parser.calls], out


@pytest.mark.parametrize(("name", "vocab", "markers", "parser", "parallel"), CASES,
                         ids=[c[0].removesuffix(".jinja") for c in CASES])
def test_the_template_writes_calls_the_parser_reads_back(
        name: str, vocab: str, markers: dict[int, tuple[str, int]], parser: str, parallel: bool,
        llama_cpp_models: Path, tmp_path: Path) -> None:
    source = (llama_cpp_models / "templates" / name).read_text(encoding="utf-8")
    fmt = tool_format(source)
    assert fmt is not None and fmt.name == parser
    path = qwen35_vocabulary(tmp_path / "q35.gguf") if vocab == "qwen35" \
        else llama_cpp_models / f"ggml-vocab-{vocab}.gguf"
    model = tiny_model(tmp_path / "m.gguf", path, template=source, markers=markers, name="t")
    tok = tokenizer_from_gguf(model).tokenizer
    template = ChatTemplate(source, tok, bos_id=None, eos_id=None, add_bos=False)
    calls = CALLS if parallel else CALLS[:1]
    ids = _turn(template, tok, calls)
    content, parsed, out = _parse(fmt, tok, ids)
    thought = content.split("</think>")[-1]  # a reasoning template's empty thought, if any
    assert thought.strip() == "" and parsed == calls
    assert out == ids  # every id once, in order


@pytest.mark.parametrize("fmt", FORMATS, ids=[f"{f.name}-{f.sign}" for f in FORMATS])
def test_each_format_reads_what_it_writes_however_it_is_split(fmt: Any) -> None:
    """A format's own rendering (what a grammar forces) parses back, text before the calls
    stays content, and any split into pushes gives the same result."""
    from tokenwire.protocol.tools import ToolCall
    from tokenwire.serving.output import Delta

    calls = [ToolCall.model_validate({"id": "x", "type": "function", "function": {
        "name": n, "arguments": json.dumps(a, ensure_ascii=False)}}) for n, a in CALLS]
    text = fmt.calls_text("Let me check.", calls)
    for step in (len(text), 1, 2, 3, 7):
        p = fmt.parser()
        content, ids = "", []
        for k in range(0, len(text), step):
            d = p.push(Delta(ids=[k], text=text[k:k + step]))
            content, ids = content + d.content, ids + d.ids
        d = p.finish()
        content, ids = content + d.content, ids + d.ids
        assert content == "Let me check.", (step, text)
        assert [(c.name, json.loads(c.arguments)) for c in p.calls] == CALLS
        assert ids == list(range(0, len(text), step))


def test_the_parser_names_are_vllms() -> None:
    assert PARSERS == ("deepseek_v31", "deepseek_v3", "mistral", "qwen3_coder", "hermes",
                       "llama3_json")


def test_xml_calls_are_qwen3_coders_not_hermes(llama_cpp_models: Path) -> None:
    """Qwen 3.5's and Qwen3-Coder's `<tool_call><function=...>` calls are not Hermes's JSON;
    their arguments are made as vLLM 0.32 makes them: every value its text, a string."""
    for name in ("Qwen3.5-4B.jinja", "Qwen3-Coder.jinja"):
        source = (llama_cpp_models / "templates" / name).read_text(encoding="utf-8")
        fmt = tool_format(source)
        assert fmt is not None and fmt.name == "qwen3_coder"
    from tokenwire.serving.output import Delta

    p = QWEN3_XML.parser()
    text = ("I will look.\n<tool_call>\n<function=f>\n<parameter=n>\n12\n</parameter>\n"
            "<parameter=s>\nline one\nline \"two\"\n\n</parameter>\n</function>\n</tool_call>")
    d = p.push(Delta(ids=[0], text=text), last=True)
    assert d.content == "I will look." and d.ids == [0]
    assert [(c.name, json.loads(c.arguments)) for c in p.calls] == [
        ("f", {"n": "12", "s": 'line one\nline "two"\n'})]  # one newline trimmed each side


@pytest.mark.parametrize(("name", "parser"), [
    ("GLM-4.6.jinja", None), ("GLM-4.7-Flash.jinja", None), ("Spark2.5.jinja", None),
    ("inclusionai-ling-3.0-flash.jinja", None), ("poolside-Laguna-XS.2.jinja", None),
    ("unsloth-Apriel-1.5.jinja", None), ("MiniMax-M3.jinja", None),
    ("deepseek-ai-DeepSeek-V3.2.jinja", None),
    ("Reka-Edge.jinja", "hermes"), ("ibm-granite-granite-4.0.jinja", "hermes"),
    ("Bielik-11B-v3.0-Instruct.jinja", "hermes"), ("MiMo-VL.jinja", "hermes"),
    ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", "hermes"),
    ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", "qwen3_coder"),
    ("StepFun3.5-Flash.jinja", "qwen3_coder"), ("meta-llama-Llama-3.2-3B-Instruct.jinja",
                                                 "llama3_json"),
])
def test_each_template_is_read_in_its_own_format_or_refused(
        name: str, parser: str | None, llama_cpp_models: Path) -> None:
    """Most families write `<tool_call>`; only those whose call inside is Hermes's JSON are
    read as Hermes, the others (GLM's `<arg_key>`, a name right after the tag, YAML, `<invoke>`)
    are refused rather than misread."""
    fmt = tool_format((llama_cpp_models / "templates" / name).read_text(encoding="utf-8"))
    assert (fmt.name if fmt is not None else None) == parser
