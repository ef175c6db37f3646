"""Base classes of every wire model (server and client share them).

The docstring under a field is its `description` in the JSON schema (GET /openapi.json).
"""

from __future__ import annotations

import base64
import binascii
import copy
import sys
from array import array
from collections.abc import Sequence
from types import UnionType
from typing import Annotated, Any, ClassVar, TypeVar, Union, get_args, get_origin

import orjson
from pydantic import BaseModel, ConfigDict, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

__all__ = ["OR_BASE64", "Frame", "PackedIds", "RawJSON", "RequestModel", "ResponseModel",
           "pack_ids"]


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
    packable: ClassVar[frozenset[str]] = frozenset()
    """The fields of ids (`OR_BASE64`) that `pack_ids` writes as base64."""
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
        cls.packable = frozenset(name for name, f in cls.model_fields.items()
                                 if OR_BASE64 in f.metadata or _marked(f.annotation))
        fields = [f for name, f in cls.model_fields.items() if name in cls.omit_if_none]
        if any(f.exclude_if is None for f in fields):
            for f in fields:
                f.exclude_if = _is_none
            cls.model_rebuild(force=True)


def _marked(tp: Any) -> bool:
    """`tp` is, or holds in a union, `Annotated[..., OR_BASE64]`."""
    if get_origin(tp) is Annotated:
        return OR_BASE64 in tp.__metadata__
    return get_origin(tp) in (Union, UnionType) and any(_marked(a) for a in get_args(tp))


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
    model wrote once for the stream), where a wire model would be (api/sse.py)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data

    def json_bytes(self) -> bytes:
        return self.data


_LITTLE = sys.byteorder == "little"
M = TypeVar("M")


class PackedIds:
    """Ids as base64 of little-endian int32, where a list of ids would be: what a client that
    asked for `encoding_format: "base64"` reads (OpenAI's embeddings' idea). 5⅓ bytes an id
    whatever its digits, so not fewer bytes than the list for the low ids text is mostly made
    of, but no number to parse per id (docs/api.md, measured)."""

    __slots__ = ("text",)

    def __init__(self, ids: Sequence[int]):
        a = ids if isinstance(ids, array) and ids.typecode == "i" else array("i", ids)
        if not _LITTLE:
            a = array("i", a)
            a.byteswap()
        self.text = base64.b64encode(a.tobytes()).decode("ascii")

    @staticmethod
    def unpack(text: str) -> list[int]:
        """The ids a base64 string holds (a ValueError, said for the client, if it holds none)."""
        try:
            raw = base64.b64decode(text, validate=True)
        except binascii.Error:
            raise ValueError("not base64 (the ids as base64 of little-endian int32)") from None
        if len(raw) % 4:
            raise ValueError(f"{len(raw)} bytes of base64 are not a whole number of int32 ids")
        a = array("i", raw)
        if not _LITTLE:
            a.byteswap()
        return a.tolist()


class _OrBase64:
    """A list of ids that may also come, and be written, as one base64 string (`PackedIds`):
    read into the same list, checked by the same rules; written where `pack_ids` put one."""

    def __get_pydantic_core_schema__(self, source: Any,
                                     handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        ids = handler(source)
        # read: a string is unpacked first, then checked as the list would be (the first
        # error is the list's); written: a union pydantic-core serializes itself (a list costs
        # next to nothing more). The "~" labels stay out of an error's path.
        return core_schema.union_schema([
            (core_schema.no_info_before_validator_function(_unpack_str, ids), "~ids"),
            (core_schema.is_instance_schema(PackedIds, serialization=core_schema.
                                            plain_serializer_function_ser_schema(_text)),
             "~packed")])

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        ids = handler(schema["choices"][0][0]["schema"])
        return {"anyOf": [ids, {"type": "string", "contentEncoding": "base64",
                                "description": "The same ids as base64 of little-endian "
                                               "int32 (`encoding_format: \"base64\"`)."}]}


def _unpack_str(value: Any) -> Any:
    return PackedIds.unpack(value) if isinstance(value, str) else value


def _text(value: PackedIds) -> str:
    return value.text


#: `Annotated[list[int], OR_BASE64]`: ids as a JSON list or as base64 of int32
OR_BASE64 = _OrBase64()


def pack_ids(model: M) -> M:
    """`model` with every list of ids in it (its `OR_BASE64` fields, nested models' too) as
    base64: a copy, where anything changed (the list the service holds stays a list)."""
    if not isinstance(model, ResponseModel):
        return model
    update: dict[str, Any] = {}
    names = model.packable
    for name, value in model.__dict__.items():
        if name in names and isinstance(value, (list, array)):
            update[name] = PackedIds(value)
        elif isinstance(value, ResponseModel):
            packed = pack_ids(value)
            if packed is not value:
                update[name] = packed
        elif isinstance(value, list) and value and isinstance(value[0], ResponseModel):
            items = [pack_ids(v) for v in value]
            if any(a is not b for a, b in zip(items, value, strict=True)):
                update[name] = items
    return model.model_copy(update=update) if update else model
