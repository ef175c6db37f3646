"""What every generating request passes before the engine: the checks on the ids it sends and
the content policy, one policy for text and token input alike. A conversation's checks are one
method, shared by chat and /v1/tokenize (which gives exactly the chat prompt)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..config import Settings
from ..errors import ContentPolicyViolationError, InvalidRequestError, NonCanonicalTokensError
from ..policy import ContentPolicy, Violation
from ..protocol.chat import ChatMessage
from ..protocol.common import ResponseWarning
from ..protocol.tools import Tool
from ..tokenizers.base import Tokenizer
from ..tokenizers.conversions import conversion_reason
from .messages import check_messages, check_tools, message_id_spans, message_texts, tool_texts
from .tokens import IdSpan, TokenSpace, check_id_range, check_special_ids, is_canonical

__all__ = ["RAW_PROMPT_HINT", "Guard"]

RAW_PROMPT_HINT = ("raw prompts with control tokens are allowed on a keyless loopback server, "
                   "or with TOKENWIRE_RAW_PROMPTS=allow, or for keys in "
                   "TOKENWIRE_RAW_PROMPT_KEYS")


class Guard:
    def __init__(self, settings: Settings, policy: ContentPolicy):
        self._settings = settings
        self.policy = policy

    def check_ids(self, spans: Sequence[IdSpan], tokenizer: Tokenizer, *,
                  raw_prompt: bool = False, caller_key: str | None = None,
                  encoded: bool = False) -> list[ResponseWarning]:
        """Limits, control tokens, canonicality; returns the warnings of `flag` mode.

        `raw_prompt`: the spans are whole prompts the client rendered itself (completions with
        ids, /inference/v1/generate), which carry the template's control ids where the
        deployment allows raw prompts for this caller. Such a caller may also send control ids
        in assistant history (a model samples them now and then, and an RL trainer feeds its
        samples back as they are): it could forge any structure through a raw prompt anyway.
        `encoded`: the server encoded the ids from the client's text (TGI's `inputs`), so they
        are canonical by construction and not checked for it."""
        s = self._settings
        self.check_id_count(spans)
        if raw_prompt:
            if not s.raw_prompts_allowed(caller_key):
                check_special_ids(spans, tokenizer, hint=RAW_PROMPT_HINT)
        elif not s.allow_special_token_ids:
            trusted = s.raw_prompts_allowed(caller_key)
            check_special_ids([sp for sp in spans if not (sp.assistant and trusted)], tokenizer)
        warnings = []
        for span in [] if encoded else spans:
            mode = s.non_canonical_tokens_assistant if span.assistant else s.non_canonical_tokens
            if mode == "allow":
                continue
            with conversion_reason("canonical"):
                if is_canonical(span.ids, tokenizer):
                    continue
            message = ("these ids are not the canonical encoding of their own text "
                       "(re-encoding it gives other ids)")
            if mode == "reject":
                raise NonCanonicalTokensError(message, param=span.param)
            warnings.append(ResponseWarning(code="non_canonical_tokens", param=span.param,
                                            message=message))
        return warnings

    def check_conversation(self, messages: Sequence[ChatMessage], tools: Sequence[Tool],
                           space: TokenSpace, caller_key: str | None = None,
                           ) -> list[ResponseWarning]:
        """Everything a chat prompt is checked for before it is rendered: the messages' shape
        and count, their ids (range, count, control tokens, canonicality) and the content
        policy on their text and the tools; returns the warnings of `flag` mode."""
        check_messages(messages)
        if len(messages) > self._settings.max_messages:
            raise InvalidRequestError(f"at most {self._settings.max_messages} messages per "
                                      "request", param="messages", code="invalid_value")
        check_tools(tools, messages)
        spans = message_id_spans(messages, space.client.tokenizer.special_ids)
        check_id_range(spans, space.client.tokenizer)
        warnings = self.check_ids(spans, space.client.tokenizer, caller_key=caller_key)
        if self.reads_input:  # else no content is decoded for it
            with conversion_reason("policy"):
                texts = [(f"messages[{i}].content", t)
                         for i, t in enumerate(message_texts(messages, space))]
            self.check_texts([*texts, *tool_texts(tools, messages)], "messages")
        return warnings

    @property
    def reads_input(self) -> bool:
        """Does the content policy read requests? (Ids are decoded for it only then.)"""
        return self.policy.check_input

    def check_id_count(self, spans: Sequence[IdSpan]) -> None:
        """At most `max_request_token_ids` ids in one request, all fields together."""
        total = sum(len(span.ids) for span in spans)
        limit = self._settings.max_request_token_ids
        if total > limit:
            raise InvalidRequestError(
                f"this request sends {total} token ids; the limit is {limit}",
                param=spans[0].param.split("[")[0] if spans else None, code="invalid_value")

    def check_texts(self, texts: Sequence[tuple[str, str]], whole_param: str) -> None:
        """Each (param, text), then all of them together: content split across blocks or
        messages gets the verdict it would get in one piece."""
        for param, text in texts:
            self._verdict(self.policy.check(text), param)
        if len(texts) > 1:
            self._verdict(self.policy.check("\n".join(t for _, t in texts)), whole_param)

    def check_prompts(self, prompts: Sequence[tuple[str, str | Sequence[int]]],
                      tokenizer: Tokenizer, whole_param: str) -> None:
        """`check_texts` on (param, text or ids) prompts, ids decoded with `tokenizer`, only
        when the policy reads requests (else nothing is decoded for it)."""
        if not self.reads_input:
            return
        with conversion_reason("policy"):
            texts = [(param, p if isinstance(p, str) else tokenizer.decode(p))
                     for param, p in prompts]
        self.check_texts(texts, whole_param)

    @staticmethod
    def _verdict(v: Violation | None, param: str) -> None:
        if v is not None:
            raise ContentPolicyViolationError(
                "this request was refused by the server's content policy", param=param)

    def output_check(self) -> Callable[[str], Violation | None] | None:
        return self.policy.check if self.policy.check_output else None
