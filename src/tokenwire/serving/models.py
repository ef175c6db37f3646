"""Served models: an engine, the tokenizer version it reads and writes, and its chat template."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from ..engines.base import Engine
from ..errors import InvalidRequestError, ModelNotFoundError
from ..tokenizers.base import Tokenizer
from ..tokenizers.registry import TokenizerEntry
from .reasoning import ReasoningFormat
from .template import ChatTemplate
from .toolcalls import HERMES, ToolFormat, template_version

__all__ = ["ModelRegistry", "ServedModel"]


@dataclass
class ServedModel:
    id: str
    engine: Engine
    tokenizer_entry: TokenizerEntry
    template: ChatTemplate | None
    created: int = field(default_factory=lambda: int(time.time()))
    reasoning: ReasoningFormat | None = None
    """How the model writes its reasoning (from its template or `reasoning_parser`): its
    chat output is split into reasoning and content (serving/reasoning.py)."""
    tools: ToolFormat | None = HERMES
    """The format its tool calls are written in (from its template or `tool_call_parser`;
    serving/toolcalls/); None: its template writes them in a format not parsed here."""
    adapter: str | None = None
    """A LoRA adapter's name, where this is one of the engine's adapters (`id` is then the
    adapter's name, the rest the base model's)."""
    parent: str | None = None
    """The base model's id, for an adapter."""

    @property
    def tokenizer(self) -> Tokenizer:
        return self.tokenizer_entry.tokenizer

    @property
    def tokenizer_version(self) -> str:
        return self.tokenizer_entry.version

    @property
    def max_model_len(self) -> int:
        return self.engine.info.max_model_len

    @property
    def template_version(self) -> str | None:
        """Hash of the chat template and the tool format used with it."""
        if self.template is None:
            return None
        return template_version(self.template, self.tools)

    def chat_template(self) -> ChatTemplate:
        if self.template is None:
            raise InvalidRequestError(
                f"model {self.id!r} has no chat template; use /v1/completions", param="model"
            )
        return self.template


class ModelRegistry:
    def __init__(self) -> None:
        self._models: dict[str, ServedModel] = {}

    def add(self, model: ServedModel) -> None:
        if model.id in self._models:
            raise ValueError(f"two models are served as {model.id!r}: name one")
        self._models[model.id] = model
        model.tokenizer_entry.models.add(model.id)

    def get(self, name: str, *, param: str = "model") -> ServedModel:
        model = self._models.get(name) or self._adapter(name)
        if model is None:
            known = ", ".join(sorted(self._models)) or "none"
            raise ModelNotFoundError(
                f"The model {name!r} does not exist; this server serves: {known}", param=param
            )
        return model

    def _adapter(self, name: str) -> ServedModel | None:
        """A LoRA adapter some model's engine serves under `name` (vLLM's rule: a request
        names an adapter as its model)."""
        for m in self._models.values():
            if name in m.engine.adapters():
                return replace(m, id=name, adapter=name, parent=m.id)
        return None

    def adapters(self) -> list[tuple[ServedModel, str]]:
        """Every adapter served now, with the path it was loaded from."""
        out = []
        for m in self._models.values():
            for name, path in m.engine.adapters().items():
                out.append((replace(m, id=name, adapter=name, parent=m.id), path))
        return out

    def all(self) -> list[ServedModel]:
        return list(self._models.values())

    def only(self) -> ServedModel:
        """The model a request that names none means: the only one served."""
        if len(self._models) != 1:
            raise InvalidRequestError(
                "name the model: this server serves " + (", ".join(sorted(self._models))
                                                         or "none"),
                param="model", code="missing_required_parameter")
        return next(iter(self._models.values()))


