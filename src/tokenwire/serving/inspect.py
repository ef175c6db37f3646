"""The token inspector's reads: a stored chat completion or response as GET /inspect draws it.
The record's prompt and sampled ids, each with its piece, where each message went, which ids
an earlier turn sampled, and each sampled id's logprob and weights where the response had them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from ..errors import TokenwireError
from ..protocol.common import WeightVersionSpan
from ..protocol.inspect import InspectedPrompt, InspectedSample, Inspection
from ..protocol.render import MessageSpan
from ..protocol.responses import ResponsesRequest
from ..storage import StoredResponse
from ..tokenizers.registry import TokenizerRegistry
from .chat import ChatService
from .responses.input import to_chat_request
from .responses.stored_responses import StoredResponses
from .service import Caller
from .stored_completions import StoredCompletions
from .tokenize import pieces

__all__ = ["InspectService"]


def _logprobs(entries: Sequence[dict[str, Any]] | None, ids: Sequence[int]) -> list[float] | None:
    """The entries' logprobs when they are exactly one per id, in order (each entry names its
    id); otherwise none rather than shading the wrong tokens."""
    if not entries or [e.get("id") for e in entries] != list(ids):
        return None
    return [float(e["logprob"]) for e in entries]


class InspectService:
    """Reads through the stored services it is handed (the routes refuse them by name on a
    server without storage)."""

    def __init__(self, tokenizers: TokenizerRegistry, chat: ChatService):
        self._tokenizers = tokenizers
        self._chat = chat

    def _pieces(self, version: str, ids: Sequence[int]) -> list[Any]:
        return pieces(self._tokenizers.resolve(version).tokenizer, ids)

    async def completion(self, id: str, caller: Caller, stored: StoredCompletions) -> Inspection:
        r = await stored.record(id, caller)
        sent = r.request.get("messages", [])
        spans = [MessageSpan(message_index=i, role=sent[i]["role"], start=a, end=b)
                 for i, a, b in r.spans if i < len(sent)]
        mask = [0] * len(r.prompt_ids)
        for s in spans:  # an assistant turn sent back as ids is what the model sampled
            if s.role == "assistant" and sent[s.message_index].get("token_ids") is not None:
                mask[s.start:s.end] = [1] * (s.end - s.start)
        samples = []
        for choice in r.response.get("choices", []):
            i = choice["index"]
            ids = r.output_ids[i] if i < len(r.output_ids) else []
            wv = choice.get("weight_versions")
            samples.append(InspectedSample(
                index=i, token_ids=ids, pieces=self._pieces(r.tokenizer_version, ids),
                logprobs=_logprobs((choice.get("logprobs") or {}).get("content"), ids),
                weight_versions=[WeightVersionSpan(**w) for w in wv] if wv else None,
                finish_reason=choice.get("finish_reason")))
        note = None if spans or not sent else (
            "the prompt was cut (truncate_prompt_tokens): its messages' places were not kept")
        return Inspection(
            kind="chat.completion", id=r.id, model=r.model, tokenizer_version=r.tokenizer_version,
            template_version=r.template_version, note=note, samples=samples,
            prompt=InspectedPrompt(token_ids=r.prompt_ids,
                                   pieces=self._pieces(r.tokenizer_version, r.prompt_ids),
                                   spans=spans or None, sampled_mask=mask))

    async def response(self, id: str, caller: Caller, stored: StoredResponses) -> Inspection:
        r = await stored.record(id, caller)
        spans, mask, note = await self._prompt_marks(r, caller, stored)
        entries = [lp for item in r.response.get("output", []) if item.get("type") == "message"
                   for part in item.get("content", []) for lp in part.get("logprobs") or []]
        wv = r.response.get("weight_versions")
        sample = InspectedSample(
            index=0, token_ids=r.output_ids, pieces=self._pieces(r.tokenizer_version,
                                                                 r.output_ids),
            logprobs=_logprobs(entries, r.output_ids), finish_reason=r.response.get("status"),
            weight_versions=[WeightVersionSpan(**w) for w in wv] if wv else None)
        return Inspection(
            kind="response", id=r.id, model=r.model, tokenizer_version=r.tokenizer_version,
            template_version=r.template_version, note=note, samples=[sample],
            prompt=InspectedPrompt(token_ids=r.prompt_ids,
                                   pieces=self._pieces(r.tokenizer_version, r.prompt_ids),
                                   spans=spans, sampled_mask=mask))

    async def _prompt_marks(self, r: StoredResponse, caller: Caller, stored: StoredResponses,
                            ) -> tuple[list[MessageSpan] | None, list[int], str | None]:
        """A response keeps no spans: its request is rendered again, and the spans are drawn
        when that gives exactly the kept prompt. A prompt continued by id is the earlier
        prompt and the ids it sampled, which the chain of kept records places exactly."""
        mask = [0] * len(r.prompt_ids)
        if r.previous_id is not None:
            prev: StoredResponse | None = r
            while prev is not None and prev.previous_id is not None:
                try:
                    prev = await stored.record(prev.previous_id, caller)
                except TokenwireError:
                    break
                if prev.tokenizer_version != r.tokenizer_version:
                    break  # translated when continued: its lengths are not this prompt's
                a = len(prev.prompt_ids)
                mask[a:a + len(prev.output_ids)] = [1] * len(prev.output_ids)
            return None, mask[:len(r.prompt_ids)], (
                "continued by previous_response_id: the ids earlier turns sampled are marked; "
                "the messages' places are not kept")
        try:
            chat, _ = to_chat_request(ResponsesRequest.model_validate(r.request))
            render = await self._chat.render(chat, caller)
        except (TokenwireError, ValidationError) as exc:  # e.g. an older release's record
            return None, mask, f"the request does not render again here ({exc})"
        if render.token_ids != r.prompt_ids:
            return None, mask, ("the request renders differently now (another template or "
                                "tokenizer): the messages' places are not drawn")
        return render.spans, render.sampled_mask, None
