"""What a chat request reads from storage and leaves there: its `input_document` blocks
spliced in (documents.py) and, with `store: true`, its record (which stored_completions.py
reads back)."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import InvalidRequestError, UnsupportedParameterError
from ..protocol.chat import ChatCompletion, ChatCompletionRequest
from ..protocol.common import ResponseWarning
from ..storage import StoredCompletion
from .chat_plan import ChatPlan
from .documents import DocumentService
from .generation import ChoiceResult
from .models import ModelRegistry
from .service import Caller
from .stored_completions import StoredCompletions, stops_of

__all__ = ["splice_documents", "stored_record"]


async def splice_documents(req: ChatCompletionRequest, caller: Caller, *,
                           stored: StoredCompletions | None, documents: DocumentService | None,
                           models: ModelRegistry,
                           ) -> tuple[ChatCompletionRequest, list[ResponseWarning]]:
    """`req` with its `input_document` blocks spliced in from storage, and what the splice
    notes; `store` and `request_id` checked against the store first, before any work."""
    if req.store and stored is None:
        raise UnsupportedParameterError("this server keeps no records (no storage)",
                                        param="store")
    if req.store and req.request_id is not None and "\x00" in req.request_id:
        raise InvalidRequestError("a stored completion's id cannot hold NUL characters",
                                  param="request_id")
    if req.store and req.request_id is not None and stored is not None:
        # before generating (the insert is still the arbiter between gateways)
        await stored.check_free(f"chatcmpl-{req.request_id}", caller)
    if documents is None:
        return req, []
    return await documents.splice(req, caller, models.get(req.model).tokenizer_entry.version)


def stored_record(plan: ChatPlan, sent: ChatCompletionRequest, completion: ChatCompletion,
                  acc: Sequence[ChoiceResult], caller: Caller) -> StoredCompletion:
    """`store: true`'s record: the request as sent, the response as it went out, and the ids
    of both sides (the model's)."""
    whole = plan.prompt == plan.conv.ids  # a truncated prompt no longer has every message
    return StoredCompletion(
        id=plan.id, owner=caller.owner, model=plan.model.id, created=plan.created,
        tokenizer_version=plan.space.model.version,
        template_version=plan.model.template_version, prompt_ids=plan.prompt,
        vocab_size=plan.model.tokenizer.vocab_size,
        request=sent.model_dump(mode="json", exclude_unset=True, by_alias=True),
        response=completion.model_dump(mode="json"), metadata=sent.metadata or {},
        output_ids=[list(a.ids) for a in acc], spans=plan.conv.spans if whole else [],
        stops=stops_of(acc))
