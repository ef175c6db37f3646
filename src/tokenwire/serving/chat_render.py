"""POST /v1/chat/completions/render: the prompt a chat request would run with, and its
sampling parameters as vLLM's render endpoint names them (what `ChatService.render` answers)."""

from __future__ import annotations

import json
from typing import Any

from ..engines.grammars.xgrammar import structural_tag
from ..errors import UnsupportedParameterError
from ..protocol.chat import ChatCompletionRequest
from ..protocol.render import RenderResponse
from .chat_plan import ChatPlan

__all__ = ["render_response"]


def render_response(plan: ChatPlan, req: ChatCompletionRequest) -> RenderResponse:
    """The prompt `plan` would run with, where each message went, and the loss mask; `req`:
    the request as sent (`plan.req` is it with documents spliced in, reasoning dropped)."""
    sp: dict[str, Any] = {
        "n": req.n, "max_tokens": plan.budget, "seed": req.seed,
        "presence_penalty": req.presence_penalty,
        "frequency_penalty": req.frequency_penalty,
    }
    if req.temperature is not None:
        sp["temperature"] = req.temperature
    if req.top_p is not None:
        sp["top_p"] = req.top_p
    if req.stop:
        sp["stop"] = req.stop
    if req.logprobs:
        sp["logprobs"] = req.top_logprobs or 0
    if plan.prompt != plan.conv.ids:
        raise UnsupportedParameterError(
            "render shows where every message went; a truncated prompt loses that",
            param="truncate_prompt_tokens")
    x = plan.extras
    for key, value, neutral in (
            ("top_k", x.top_k, 0), ("min_p", x.min_p, 0.0),
            ("repetition_penalty", x.repetition_penalty, 1.0),
            ("min_tokens", x.min_tokens, 0), ("ignore_eos", x.ignore_eos, False),
            ("stop_token_ids", sorted(x.stop_token_ids), []),
            ("logit_bias", {str(t): b for t, b in x.logit_bias}, {}),
            ("include_stop_str_in_output", req.include_stop_str_in_output, False)):
        if value != neutral:
            sp[key] = value
    if req.thinking_token_budget is not None:
        sp["thinking_token_budget"] = req.thinking_token_budget
    grammar = plan.constraints.grammar
    if grammar is not None and grammar.reasoning is not None and not (
            grammar.json_schema or grammar.gbnf or grammar.tags):
        grammar = None  # only the budget's: vLLM's field says it
    if grammar is not None and not grammar.lazy:  # as vLLM reads it
        sp["structured_outputs"] = {"json": json.loads(grammar.json_schema)} \
            if grammar.json_schema is not None \
            else {"structural_tag": structural_tag(grammar)}
    return RenderResponse(
        request_id=plan.id, token_ids=plan.prompt, model=plan.model.id,
        sampling_params=sp, stream=req.stream,
        tokenizer_version=plan.space.model.version,  # the prompt is in the model's ids
        template_version=plan.model.template_version,
        spans=plan.conv.message_spans(req.messages),
        sampled_mask=plan.conv.sampled, warnings=plan.warnings)
