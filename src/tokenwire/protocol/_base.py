"""Base classes of every wire model (server and client share them)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer

__all__ = ["RequestModel", "ResponseModel"]


class RequestModel(BaseModel):
    """A request body: unknown fields are errors, and JSON types are not coerced
    (`"1"` is not an int, `1` is not a bool), so nothing a client sent is silently altered."""

    model_config = ConfigDict(extra="forbid", strict=True)


class ResponseModel(BaseModel):
    """A response body. Clients tolerate fields they do not know (servers add fields over time).

    Token-native fields that were not asked for are left out of the JSON entirely, so a plain
    OpenAI request gets a plain OpenAI response: list them in `omit_if_none`.
    """

    model_config = ConfigDict(extra="allow")
    omit_if_none: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _omit_extensions(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            for key in self.omit_if_none:
                if key in data and data[key] is None:
                    del data[key]
        return data
