"""Base classes of every wire model (server and client share them).

The docstring under a field is its `description` in the JSON schema (GET /openapi.json).
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar

import orjson
from pydantic import BaseModel, ConfigDict, GetCoreSchemaHandler
from pydantic_core import core_schema

__all__ = ["Frame", "RawJSON", "RequestModel", "ResponseModel"]


def _neutral_only(schema: dict[str, Any], cls: type[BaseModel]) -> None:
    """A field tokenwire does not implement (a request model's `unsupported`, field -> values
    that mean "off") accepts only those values, and its schema says so."""
    unsupported: dict[str, tuple[Any, ...]] = getattr(cls, "unsupported", {})
    for name, neutral in unsupported.items():
        key = cls.model_fields[name].alias or name
        old = schema["properties"][key]
        schema["properties"][key] = {
            **{k: old[k] for k in ("title", "default") if k in old},
            "enum": copy.deepcopy(list(neutral)),
            "description": "Not implemented by tokenwire: only the values that leave it off "
                           "are accepted; any other is a 400 `unsupported_parameter`.",
        }


class RequestModel(BaseModel):
    """A request body: unknown fields are errors, and JSON types are not coerced
    (`"1"` is not an int, `1` is not a bool), so nothing a client sent is silently altered."""

    model_config = ConfigDict(extra="forbid", strict=True, use_attribute_docstrings=True,
                              json_schema_extra=_neutral_only)


def _always_sent(schema: dict[str, Any], cls: type[BaseModel]) -> None:
    """A response's schema requires every field but those left out when None: the serializer
    writes them all, defaults included."""
    omitted: frozenset[str] = getattr(cls, "omit_if_none", frozenset())
    schema["required"] = [f.alias or name for name, f in cls.model_fields.items()
                          if name not in omitted]


class ResponseModel(BaseModel):
    """A response body. Clients tolerate fields they do not know (servers add fields over time).

    Token-native fields that were not asked for are left out of the JSON entirely, so a plain
    OpenAI request gets a plain OpenAI response: list them in `omit_if_none`.
    """

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True,
                              json_schema_extra=_always_sent)
    omit_if_none: ClassVar[frozenset[str]] = frozenset()
    carries_raw: ClassVar[bool] = False
    """Some field may hold `RawJSON` (a whole answer's logprobs): `json_bytes` writes it with
    orjson, which splices it in unparsed."""

    def json_bytes(self) -> bytes:
        """This response as JSON, as sent."""
        if self.carries_raw:
            return orjson.dumps(self.model_dump())
        return self.model_dump_json().encode()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        # pydantic's own per-field exclusion, not a serializer of ours wrapped around every
        # model: a streamed chunk is three models, dumped once per token
        super().__pydantic_init_subclass__(**kwargs)
        fields = [f for name, f in cls.model_fields.items() if name in cls.omit_if_none]
        if any(f.exclude_if is None for f in fields):
            for f in fields:
                f.exclude_if = _is_none
            cls.model_rebuild(force=True)


def _is_none(value: object) -> bool:
    return value is None


class RawJSON:
    """A field's JSON written in bulk elsewhere (a whole answer's logprobs: thousands of entries,
    serving/logprobs.py), in place of the models it stands for. `ResponseModel.json_bytes`
    splices it in as it is; any other dump reads it back first (the same JSON)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data

    @classmethod
    def array(cls, items: list[str]) -> RawJSON:
        """A JSON array of items each already JSON."""
        return cls(("[" + ",".join(items) + "]").encode())

    def parsed(self) -> Any:
        return orjson.loads(self.data)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any,
                                     handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.is_instance_schema(
            cls, serialization=core_schema.plain_serializer_function_ser_schema(
                _raw, info_arg=True))


def _raw(value: RawJSON, info: core_schema.SerializationInfo) -> Any:
    return value.parsed() if info.mode_is_json() else orjson.Fragment(value.data)


class Frame:
    """An event already written as JSON (a plain chat chunk: its text between the bytes a
    model wrote once for the stream), where a wire model would be (server/sse.py)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data

    def json_bytes(self) -> bytes:
        return self.data
