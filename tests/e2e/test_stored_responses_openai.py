"""Stored responses and `previous_response_id` against the live server (the real model;
embedded, or a gateway in front of a real upstream), through the official `openai` SDK's own
calls: a conversation continued by id alone, from the exact ids of each turn."""

from __future__ import annotations

from typing import Any

import openai
import pytest

pytestmark = pytest.mark.engine

MODEL = "SmolLM2-135M-Instruct"
IDS: Any = ["input.token_ids", "output.token_ids"]


def extra(obj: Any, key: str) -> Any:
    return (obj.model_extra or {}).get(key)


def sampled(r: Any) -> list[int]:
    return [t for item in r.output for t in extra(item, "token_ids")]


def assert_continues(before: Any, after: Any) -> None:
    """`after`'s prompt begins with `before`'s prompt and the ids it sampled, exactly."""
    kept = extra(before, "input_token_ids") + sampled(before)
    assert extra(after, "input_token_ids")[:len(kept)] == kept


def test_three_turns_by_previous_response_id_alone(client: openai.OpenAI) -> None:
    """No history is sent: each turn's prompt starts with the previous turn's prompt and
    sampled ids, the engine's prefix cache finds them, and the SDK's reads work."""
    turns = ["Name a large animal.", "And a small one?", "Which of the two is faster?"]
    made: list[Any] = []
    for text in turns:
        made.append(client.responses.create(
            model=MODEL, input=text, temperature=0, max_output_tokens=12, include=IDS,
            previous_response_id=made[-1].id if made else openai.omit))
    for before, after in zip(made, made[1:], strict=False):
        assert_continues(before, after)
        assert after.previous_response_id == before.id
    assert made[2].usage is not None
    assert made[2].usage.input_tokens_details.cached_tokens > 0

    got = client.responses.retrieve(made[1].id)
    assert (got.id, got.output_text, got.store) == (made[1].id, made[1].output_text, True)
    assert got.usage == made[1].usage
    with_prompt = client.responses.retrieve(made[2].id, include=["input.token_ids"])  # type: ignore[list-item]
    assert extra(with_prompt, "input_token_ids") == extra(made[2], "input_token_ids")
    items = list(client.responses.input_items.list(made[2].id))
    assert [(i.type, i.role) for i in items] == [("message", "user")]  # type: ignore[union-attr]
    assert items[0].content[0].text == turns[2]  # type: ignore[union-attr]

    client.responses.delete(made[2].id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(made[2].id)
    # the turn before is kept, and continues as it did
    again = client.responses.create(model=MODEL, input=turns[2], temperature=0,
                                    max_output_tokens=12, include=IDS,
                                    previous_response_id=made[1].id, store=False)
    assert extra(again, "input_token_ids") == extra(made[2], "input_token_ids")
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model=MODEL, input="hi", previous_response_id="resp_none")
    assert (err.value.code, err.value.param) == ("previous_response_not_found",  # type: ignore[attr-defined]
                                                 "previous_response_id")


def test_input_items_page_newest_first(client: openai.OpenAI) -> None:
    items: Any = [{"role": "user", "content": f"Line {i}."} for i in range(5)]
    r = client.responses.create(model=MODEL, input=items, temperature=0, max_output_tokens=2)
    page = client.responses.input_items.list(r.id, limit=2)
    assert [i.content[0].text for i in page.data] == ["Line 4.", "Line 3."]  # type: ignore[union-attr]
    assert page.has_more
    every = list(client.responses.input_items.list(r.id, limit=2))  # the SDK follows `after`
    assert [i.content[0].text for i in every] == [f"Line {i}." for i in range(4, -1, -1)]  # type: ignore[union-attr]


def test_a_streamed_response_is_stored_before_it_is_told_done(client: openai.OpenAI) -> None:
    """`response.completed` (or `.incomplete`) comes after the record is durable: a client
    that stops reading there finds it stored."""
    with client.responses.stream(model=MODEL, input="Say hi.", temperature=0,
                                 max_output_tokens=8) as stream:
        for event in stream:
            if event.type in ("response.completed", "response.incomplete"):
                kept = client.responses.retrieve(event.response.id)  # before reading further
                assert kept.output_text == event.response.output_text
                break
        else:
            raise AssertionError("the stream never ended its response")
