from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel
from starlette.responses import Response

from ..protocol._base import ResponseModel


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


class ModelResponse(Response):
    """A JSON response rendered from a wire model (its own serializer decides the fields)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        if isinstance(content, ResponseModel):
            return content.json_bytes()
        if isinstance(content, BaseModel):
            return content.model_dump_json().encode()
        return dumps(content)
