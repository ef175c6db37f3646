"""vLLM's sampling fields and the newest OpenAI ones, end to end: a real server and model, the
official `openai` SDK (its own parameters by name, vLLM's in `extra_body`, as TRL, verifiers
and SkyRL send them). Each field either changes the output as it does on vLLM, or is refused
by name; none is an unknown parameter.
"""

from __future__ import annotations

import typing
from typing import Any

import openai
import pytest
from openai.types import completion_create_params as completion_params
from openai.types.chat import completion_create_params as chat_params

from tests.conftest import TEST_UPSTREAM
from tokenwire.tokenizers.hf import HFTokenizer

pytestmark = pytest.mark.engine

MODEL = "SmolLM2-135M-Instruct"
ASK = [{"role": "user", "content": "Name three colors."}]
IM_START = 1  # SmolLM2's <|im_start|>: a control token that does not end the output


def chat(client: openai.OpenAI, messages: list[Any] = ASK, **extra: Any) -> Any:
    named = {k: extra.pop(k) for k in list(extra) if k in chat_params.CompletionCreateParamsBase
             .__annotations__}
    return client.chat.completions.create(
        model=MODEL, messages=messages, extra_body=extra or None,
        **{"max_tokens": 12, "temperature": 0, **named})


def greedy_ids(client: openai.OpenAI, **extra: Any) -> list[int]:
    return list(chat(client, return_token_ids=True, **extra).choices[0].token_ids)


# -- the SDK's own parameters ------------------------------------------------------------------

#: a value for every parameter the SDK's `chat.completions.create` takes (a new SDK parameter
#: fails the test below until it is listed here)
CHAT_VALUES: dict[str, Any] = {
    "messages": ASK, "model": MODEL, "audio": None, "frequency_penalty": 0.5,
    "function_call": "none", "functions": [], "logit_bias": {"5": 1}, "logprobs": True,
    "max_completion_tokens": 4, "max_tokens": 4, "metadata": {"k": "v"},
    "modalities": ["text"], "moderation": None, "n": 1, "parallel_tool_calls": True,
    "prediction": None, "presence_penalty": 0.5, "prompt_cache_key": "tenant-1",
    "prompt_cache_options": {"mode": "implicit", "ttl": "30m"},
    "prompt_cache_retention": "24h", "reasoning_effort": None,
    "response_format": {"type": "text"}, "safety_identifier": "user-1", "seed": 7,
    "service_tier": "auto", "stop": ["\n\n"], "store": False,
    "stream_options": None, "temperature": 0.7, "tool_choice": "none",
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
    "top_logprobs": 2, "top_p": 0.9, "user": "u", "verbosity": "medium",
    "web_search_options": None,
}
COMPLETION_VALUES: dict[str, Any] = {
    "model": MODEL, "prompt": "Hello", "best_of": 1, "echo": True, "frequency_penalty": 0.5,
    "logit_bias": {"5": 1}, "logprobs": 2, "max_tokens": 4, "n": 1, "presence_penalty": 0.5,
    "seed": 7, "stop": ["\n"], "stream_options": None, "suffix": None, "temperature": 0.7,
    "top_p": 0.9, "user": "u",
}


def _sdk_params(module: Any) -> set[str]:
    return set(typing.get_type_hints(module.CompletionCreateParamsBase, include_extras=False))


#: OpenAI's penalties count prompt tokens on llama-server, so its gateway refuses them by name
REFUSED_BY_ENGINE = {"frequency_penalty", "presence_penalty"} \
    if TEST_UPSTREAM == "llama-server" else set()


def test_every_sdk_chat_parameter_is_known(client: openai.OpenAI) -> None:
    assert _sdk_params(chat_params) == set(CHAT_VALUES), "list the SDK's new parameters"
    for name, value in CHAT_VALUES.items():
        if name in ("messages", "model", "max_tokens", "max_completion_tokens"):
            continue
        try:
            if name == "top_logprobs":
                chat(client, logprobs=True, top_logprobs=value)
            elif name == "stream_options":
                with client.chat.completions.create(
                        model=MODEL, messages=ASK, max_tokens=2, stream=True,
                        stream_options={"include_usage": True,
                                        "include_obfuscation": False}) as s:
                    assert [c for c in s][-1].usage is not None
            else:
                chat(client, **{name: value})
        except openai.BadRequestError as exc:
            assert name in REFUSED_BY_ENGINE, (name, exc.body)
            assert exc.body["code"] == "unsupported_parameter"  # type: ignore[index]
    both = chat(client, max_tokens=3, max_completion_tokens=3)
    assert both.usage.completion_tokens <= 3


def test_every_sdk_completions_parameter_is_known(client: openai.OpenAI) -> None:
    assert _sdk_params(completion_params) == set(COMPLETION_VALUES)
    # llama-server cannot score the echoed prompt (echo + logprobs): refused there by name
    skip = REFUSED_BY_ENGINE | ({"echo"} if TEST_UPSTREAM == "llama-server" else set())
    values = {k: v for k, v in COMPLETION_VALUES.items()
              if k != "stream_options" and k not in skip}
    r = client.completions.create(**values)
    assert r.choices[0].text.startswith("Hello") or "echo" in skip


def test_newest_openai_fields_that_would_change_the_output_are_refused_by_name(
        client: openai.OpenAI) -> None:
    for name, value in (("verbosity", "low"), ("reasoning_effort", "high"),
                        ("moderation", {"model": "omni-moderation-latest"})):
        with pytest.raises(openai.BadRequestError) as err:
            chat(client, **{name: value})
        assert err.value.body["code"] == "unsupported_parameter"  # type: ignore[index]
        assert err.value.body["param"] == name  # type: ignore[index]


# -- vLLM's fields, honoured -------------------------------------------------------------------

def test_logit_bias_moves_the_greedy_choice(client: openai.OpenAI) -> None:
    base = greedy_ids(client)
    pushed = greedy_ids(client, logit_bias={str(IM_START): 100})
    assert pushed[0] == IM_START != base[0]
    banned = greedy_ids(client, logit_bias={str(base[0]): -100})
    assert banned[0] != base[0]


def test_top_k_one_and_min_p_one_sample_the_argmax(client: openai.OpenAI) -> None:
    base = greedy_ids(client)
    for extra in ({"top_k": 1}, {"min_p": 1.0}):
        for seed in (1, 2):
            assert greedy_ids(client, temperature=1.0, seed=seed, **extra) == base


def test_a_wide_top_k_and_min_p_zero_leave_sampling_as_it_was(client: openai.OpenAI) -> None:
    plain = greedy_ids(client, temperature=1.0, seed=3)
    assert greedy_ids(client, temperature=1.0, seed=3, top_k=-1, min_p=0.0) == plain


def test_repetition_penalty_counts_the_prompt_as_vllms_does(client: openai.OpenAI) -> None:
    prompt = "red red red red red red red red red red red"
    def first(**extra: Any) -> str:
        return client.completions.create(model=MODEL, prompt=prompt, max_tokens=1,
                                         temperature=0, extra_body=extra or None).choices[0].text
    assert first() == " red"
    if TEST_UPSTREAM != "llama-server":  # which refuses OpenAI's penalties by name
        assert first(presence_penalty=2.0) == " red"  # they count the output only
    assert first(repetition_penalty=2.0) != " red"


def test_stop_token_ids_end_the_output(client: openai.OpenAI) -> None:
    base = greedy_ids(client)
    stop = base[3]
    r = chat(client, return_token_ids=True, stop_token_ids=[stop])
    ids = list(r.choices[0].token_ids)
    assert ids == base[:base.index(stop)] and r.choices[0].finish_reason == "stop"
    assert r.choices[0].stop_reason == stop  # type: ignore[attr-defined]


@pytest.mark.skipif(TEST_UPSTREAM == "llama-server",
                    reason="llama-server bans the end ids instead: refused by name there")
def test_ignore_eos_samples_to_the_limit(client: openai.OpenAI) -> None:
    short = chat(client, messages=[{"role": "user", "content": "Say only: yes"}],
                 max_tokens=60)
    assert short.choices[0].finish_reason == "stop"
    n = short.usage.completion_tokens
    r = chat(client, messages=[{"role": "user", "content": "Say only: yes"}],
             max_tokens=n + 4, ignore_eos=True)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == n + 4


@pytest.mark.skipif(TEST_UPSTREAM == "llama-server",
                    reason="llama-server has no minimum length: refused by name there")
def test_min_tokens_holds_off_the_end(client: openai.OpenAI) -> None:
    msgs = [{"role": "user", "content": "Say only: yes"}]
    n = chat(client, messages=msgs, max_tokens=60).usage.completion_tokens
    r = chat(client, messages=msgs, max_tokens=60, min_tokens=n + 5)
    assert r.usage.completion_tokens >= n + 5
    # nor does a stop string end it early: the first min_tokens tokens' text is not matched
    words = chat(client, max_tokens=20).choices[0].message.content
    early = chat(client, max_tokens=20, stop=[" "])
    assert early.choices[0].message.content == words.split(" ")[0]
    held = chat(client, max_tokens=20, stop=[" "], min_tokens=6, return_token_ids=True)
    assert len(held.choices[0].token_ids) >= 6  # type: ignore[attr-defined]
    assert words.startswith(held.choices[0].message.content)


@pytest.mark.skipif(TEST_UPSTREAM != "llama-server", reason="the llama-server gateway only")
def test_what_llama_server_cannot_do_is_refused_by_name(client: openai.OpenAI) -> None:
    for name, value in (("min_tokens", 3), ("ignore_eos", True)):
        with pytest.raises(openai.BadRequestError) as err:
            chat(client, **{name: value})
        assert err.value.body["param"] == name  # type: ignore[index]


def test_skip_special_tokens_leaves_control_tokens_out_of_the_text(
        client: openai.OpenAI, tok: HFTokenizer) -> None:
    forced = {"logit_bias": {str(IM_START): 100}, "max_tokens": 3, "return_token_ids": True}
    kept = chat(client, **forced)
    skipped = chat(client, skip_special_tokens=True, **forced)
    assert list(kept.choices[0].token_ids) == list(skipped.choices[0].token_ids) == \
        [IM_START] * 3
    assert kept.choices[0].message.content == tok.decode([IM_START] * 3)
    assert skipped.choices[0].message.content == ""


def test_include_stop_str_in_output(client: openai.OpenAI) -> None:
    text = chat(client, max_tokens=20).choices[0].message.content
    stop = text.split()[1]
    cut = chat(client, max_tokens=20, stop=[stop]).choices[0].message.content
    kept = chat(client, max_tokens=20, stop=[stop],
                include_stop_str_in_output=True).choices[0].message.content
    assert kept == cut + stop and text.startswith(kept)


def test_continue_final_message_and_echo(client: openai.OpenAI, tok: HFTokenizer) -> None:
    msgs = [{"role": "user", "content": "Count from one to ten."},
            {"role": "assistant", "content": "one, two, three,"}]
    r = chat(client, messages=msgs, add_generation_prompt=False, continue_final_message=True,
             echo=True, return_token_ids=True)
    prompt = list(r.prompt_token_ids)  # type: ignore[attr-defined]
    assert tok.decode(prompt).endswith("<|im_start|>assistant\none, two, three,")
    content = r.choices[0].message.content
    assert content.startswith("one, two, three,")
    assert content[len("one, two, three,"):] == tok.decode(list(r.choices[0].token_ids))
    opened = chat(client, messages=msgs, return_token_ids=True)
    assert tok.decode(list(opened.prompt_token_ids)).endswith(  # type: ignore[attr-defined]
        "<|im_end|>\n<|im_start|>assistant\n")
    bare = chat(client, messages=msgs, add_generation_prompt=False, return_token_ids=True)
    assert tok.decode(list(bare.prompt_token_ids)).endswith(  # type: ignore[attr-defined]
        "one, two, three,<|im_end|>\n")


def test_truncate_prompt_tokens_keeps_the_last_tokens(client: openai.OpenAI) -> None:
    whole = chat(client, return_token_ids=True, max_tokens=2)
    ids = list(whole.prompt_token_ids)  # type: ignore[attr-defined]
    cut = chat(client, return_token_ids=True, max_tokens=2, truncate_prompt_tokens=6)
    assert list(cut.prompt_token_ids) == ids[-6:]  # type: ignore[attr-defined]
    assert cut.usage.prompt_tokens == 6
    right = client.completions.create(model=MODEL, prompt="one two three four five six",
                                      max_tokens=1, extra_body={
                                          "truncate_prompt_tokens": 2,
                                          "truncation_side": "right",
                                          "return_token_ids": True})
    assert right.usage.prompt_tokens == 2


def test_request_id_names_the_response(client: openai.OpenAI) -> None:
    assert chat(client, request_id="abc-1").id == "chatcmpl-abc-1"
    r = client.completions.create(model=MODEL, prompt="Hi", max_tokens=1,
                                  extra_body={"request_id": "abc-2"})
    assert r.id == "cmpl-abc-2"


def test_continuous_usage_stats(client: openai.OpenAI) -> None:
    with client.chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=8, temperature=0, stream=True,
            stream_options={"include_usage": True},
            extra_body={"stream_options": {"include_usage": True,
                                           "continuous_usage_stats": True}}) as s:
        chunks = list(s)
    counts = [c.usage.completion_tokens for c in chunks]
    assert all(c.usage is not None for c in chunks)
    assert counts == sorted(counts) and counts[-1] == chunks[-1].usage.total_tokens - \
        chunks[-1].usage.prompt_tokens


def test_the_vllm_request_set_runs_as_sent(client: openai.OpenAI) -> None:
    """What RL rollouts send to vLLM (TRL's vllm client, verifiers, SkyRL), all at once."""
    r = chat(client, temperature=1.0, top_p=1.0, seed=11, max_tokens=16, n=2, logprobs=True,
             top_k=-1, min_p=0.0, repetition_penalty=1.0, stop_token_ids=[],
             include_stop_str_in_output=False, skip_special_tokens=False,
             spaces_between_special_tokens=True, min_tokens=0, ignore_eos=False,
             add_generation_prompt=True, continue_final_message=False, echo=False,
             chat_template_kwargs={"enable_thinking": False}, cache_salt="s" * 43,
             priority=0, request_id="rollout-7", return_token_ids=True,
             truncate_prompt_tokens=-1, prompt_cache_key="group-3")
    assert r.id == "chatcmpl-rollout-7" and len(r.choices) == 2
    assert all(c.token_ids for c in r.choices)  # type: ignore[attr-defined]


def test_legacy_top_logprobs_hold_the_sampled_token(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12,
                                  temperature=1.5, seed=4, logprobs=1)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens and lp.top_logprobs
    for token, top in zip(lp.tokens, lp.top_logprobs, strict=True):
        assert token in top and 1 <= len(top) <= 2
