"""Tokenize, detokenize and the published tokenizer versions, for every registered version
(also one that no model serves any more)."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..config import Settings
from ..errors import InvalidRequestError, TokenizerNotFoundError
from ..protocol.tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    SpecialToken,
    TextEncoding,
    TokenizerConfig,
    TokenizeRequest,
    TokenizeResponse,
    TokenizerInfo,
    TokenPiece,
    TranslateRequest,
    TranslateResponse,
)
from ..tokenizers.base import Tokenizer
from ..tokenizers.conversions import conversion_reason
from ..tokenizers.registry import TokenizerEntry, TokenizerRegistry
from ..tokenizers.translate import translator
from .guard import Guard
from .messages import carries_ids, render_messages, sampled_openings
from .models import ModelRegistry, ServedModel
from .service import ANONYMOUS, Caller
from .template import ChatTemplate
from .tokens import IdSpan, TokenSpace, check_id_range, resolve_token_space
from .toolcalls import HERMES, template_version

__all__ = ["Artifact", "TokenizeService", "pieces"]


@functools.lru_cache(maxsize=8)
def _added_tokens(artifact: bytes) -> dict[str, dict[str, Any]]:
    """`tokenizer_config.json`'s `added_tokens_decoder` from a tokenizer.json's `added_tokens`
    (parsed once per artifact: it is megabytes of JSON)."""
    return {str(t["id"]): {k: v for k, v in t.items() if k != "id"}
            for t in json.loads(artifact).get("added_tokens", [])}


@dataclass(frozen=True)
class Artifact:
    data: bytes
    sha256: str
    version: str
    by_alias: bool
    """Asked for by alias: the bytes behind the name may change, so they are not cacheable."""


class TokenizeService:
    def __init__(self, models: ModelRegistry, tokenizers: TokenizerRegistry, settings: Settings,
                 guard: Guard):
        self._models = models
        self._tokenizers = tokenizers
        self._settings = settings
        self._guard = guard
        self._templates: dict[str, ChatTemplate] = {}

    def _target(self, model_name: str | None, version: str | None, *, carries_ids: bool,
                ) -> tuple[TokenSpace, ServedModel | None]:
        if model_name is None and version is None:
            raise InvalidRequestError("name a model or a tokenizer_version", param="model",
                                      code="missing_required_parameter")
        if model_name is not None:
            model = self._models.get(model_name)
            space = resolve_token_space(
                target=model.tokenizer_entry, target_name=f"model {model.id!r}",
                registry=self._tokenizers, version=version, fallback="error",
                carries_ids=carries_ids,
                require_version=self._settings.require_tokenizer_version)
            return space, model
        assert version is not None
        entry = self._tokenizers.resolve(version)
        return TokenSpace(client=entry, model=entry, translate=False), None

    def _template(self, entry: TokenizerEntry, model: ServedModel | None) -> ChatTemplate:
        if model is not None:
            return model.chat_template()
        tmpl = self._templates.get(entry.version)
        if tmpl is None:
            if entry.chat_template is None:
                raise InvalidRequestError(
                    f"tokenizer version {entry.version!r} has no chat template; "
                    "tokenize a prompt instead", param="messages", code="invalid_value")
            tmpl = ChatTemplate(entry.chat_template, entry.tokenizer, bos_id=entry.bos_id,
                                eos_id=entry.eos_id, add_bos=entry.add_bos)
            self._templates[entry.version] = tmpl
        return tmpl

    def _max_model_len(self, entry: TokenizerEntry, model: ServedModel | None) -> int | None:
        if model is not None:
            return model.max_model_len
        lens = [m.max_model_len for m in self._models.all() if m.tokenizer_entry is entry]
        return max(lens) if lens else None

    @conversion_reason("tokenize")
    def tokenize(self, req: TokenizeRequest, caller: Caller = ANONYMOUS) -> TokenizeResponse:
        if (req.prompt is None) == (req.messages is None):
            raise InvalidRequestError("send exactly one of prompt and messages",
                                      param="prompt" if req.prompt is not None else "messages",
                                      code="invalid_value")
        if req.parse_special and req.messages is not None:
            raise InvalidRequestError(
                "parse_special applies to a prompt; messages are rendered as chat renders "
                "them (the template's markers parsed, contents as text)",
                param="parse_special", code="invalid_value")
        if req.continue_final_message and (req.add_generation_prompt or req.messages is None):
            raise InvalidRequestError(
                "continue_final_message continues the last of the messages; it needs them and "
                "add_generation_prompt false", param="continue_final_message",
                code="invalid_value")
        sent = req.messages is not None and carries_ids(req.messages)
        space, model = self._target(req.model, req.tokenizer_version, carries_ids=sent)
        entry = space.model
        tok = entry.tokenizer
        extra: dict[str, Any] = {}
        if req.messages is not None:
            # chat's own checks: the prompt is the chat prompt, or the same refusal
            warnings = self._guard.check_conversation(req.messages, req.tools or [], space,
                                                      caller.api_key)
            template = self._template(entry, model)
            s = self._settings
            fmt = model.tools if model is not None and model.tools is not None else HERMES
            conv = render_messages(req.messages, space, template, tools=req.tools or [], fmt=fmt,
                                   openings={} if space.translate else sampled_openings(
                                       req.messages, template, None),
                                   add_generation_prompt=req.add_generation_prompt,
                                   continue_final=req.continue_final_message,
                                   control_ids=s.allow_special_token_ids
                                   or s.raw_prompts_allowed(caller.api_key))
            ids = conv.ids
            extra = {
                "template_version": model.template_version if model is not None
                else template_version(template),
                "spans": conv.message_spans(req.messages),
                "sampled_mask": conv.sampled,
                "warnings": warnings or None,
            }
        else:
            ids = tok.encode(req.prompt or "", parse_special=req.parse_special)
            if req.add_special_tokens and entry.add_bos and entry.bos_id is not None:
                ids.insert(0, entry.bos_id)
        return TokenizeResponse(
            tokens=ids, count=len(ids), max_model_len=self._max_model_len(entry, model),
            tokenizer_version=entry.version,
            token_strs=[tok.token_str(i) for i in ids] if req.return_token_strs else None,
            **extra,
        )

    @conversion_reason("tokenize")
    def detokenize(self, req: DetokenizeRequest) -> DetokenizeResponse:
        space, _ = self._target(req.model, req.tokenizer_version, carries_ids=True)
        tok = space.model.tokenizer
        spans = [IdSpan("tokens", req.tokens)]
        self._guard.check_id_count(spans)
        check_id_range(spans, tok)
        return DetokenizeResponse(prompt=tok.decode(req.tokens), tokenizer_version=tok.version,
                                  pieces=pieces(tok, req.tokens) if req.return_pieces else None)

    def translate(self, req: TranslateRequest) -> TranslateResponse:
        """Any two registered versions, served by a model or not (tokenizers/translate.py)."""
        src, dst = self._version(req.from_, "from"), self._version(req.to, "to")
        spans = [IdSpan("token_ids", req.token_ids)]
        self._guard.check_id_count(spans)
        check_id_range(spans, src.tokenizer)
        if src is dst:  # the ids are already the target's: nothing to translate
            ids, n, lossless = list(req.token_ids), len(
                b"".join(src.tokenizer.token_bytes(t) for t in req.token_ids)), True
        else:
            got = translator(src.tokenizer, dst.tokenizer).translate(req.token_ids)
            ids, n, lossless = got.token_ids, got.text_bytes, got.lossless
        return TranslateResponse(token_ids=ids, text_bytes=n, lossless=lossless,
                                 tokenizer_version=dst.version)

    def _version(self, name: str, param: str) -> TokenizerEntry:
        entry = self._tokenizers.find(name)
        if entry is None:
            raise TokenizerNotFoundError(
                f"no tokenizer version {name!r}; GET /v1/tokenizers lists the known versions",
                param=param)
        return entry

    # -- published versions ---------------------------------------------------------------

    def info(self, entry: TokenizerEntry) -> TokenizerInfo:
        tok = entry.tokenizer
        return TokenizerInfo(
            id=entry.version, family=tok.family, aliases=sorted(entry.aliases),
            vocab_size=tok.vocab_size,
            special_tokens=[SpecialToken(id=i, content=c)
                            for c, i in tok.special_tokens.items()],
            sha256=entry.sha256, artifact_url=f"/v1/tokenizers/{entry.version}/tokenizer.json",
            text_encoding=TextEncoding(**tok.text_encoding), models=sorted(entry.models),
        )

    def config(self, model: ServedModel) -> TokenizerConfig:
        """vLLM's `/tokenizer_info` of a model's tokenizer version."""
        entry = model.tokenizer_entry
        tok = entry.tokenizer
        text = tok.token_bytes
        return TokenizerConfig(
            bos_token=text(entry.bos_id).decode() if entry.bos_id is not None else None,
            eos_token=text(entry.eos_id).decode() if entry.eos_id is not None else None,
            add_bos_token=entry.add_bos, model_max_length=model.max_model_len,
            added_tokens_decoder=_added_tokens(tok.artifact),
            chat_template=model.template.source if model.template is not None else None,
            tokenizer_version=entry.version, sha256=entry.sha256,
            artifact_url=f"/v1/tokenizers/{entry.version}/tokenizer.json",
            template_version=model.template_version)

    def list(self) -> list[TokenizerInfo]:
        return [self.info(e) for e in self._tokenizers.entries()]

    def get(self, name: str) -> TokenizerInfo:
        return self.info(self._tokenizers.get(name))

    def artifact(self, name: str) -> Artifact:
        entry = self._tokenizers.get(name)
        return Artifact(data=entry.tokenizer.artifact, sha256=entry.sha256,
                        version=entry.version, by_alias=name != entry.version)


def pieces(tok: Tokenizer, ids: Sequence[int]) -> list[TokenPiece]:
    """What each id stands for on its own (the token inspector's boxes)."""
    special = tok.special_ids
    out = []
    for t in ids:
        raw = tok.token_bytes(t)
        try:
            out.append(TokenPiece(text=raw.decode("utf-8"), control=t in special))
        except UnicodeDecodeError:
            out.append(TokenPiece(text=None, bytes=list(raw), control=t in special))
    return out
