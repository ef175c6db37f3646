"""Request bodies in, typed models out; pydantic's errors become OpenAI-shaped 400s.

The error names the culprit by its path in the body (`messages[0].content[1].token_ids[7]`);
union tags that pydantic puts in locations (ours start with "~") are dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from ..errors import InvalidRequestError, InvalidTokenIdError

__all__ = ["format_param", "parse_body", "translate_validation_error"]

M = TypeVar("M", bound=BaseModel)


def format_param(loc: Sequence[int | str]) -> str | None:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not part.startswith("~"):
            out += f".{part}" if out else part
    return out or None


#: what pydantic says of a bad element of a list of token ids
_ID_ERRORS = {"int_type", "int_parsing", "int_from_float", "greater_than_equal"}
#: fields and union tags whose elements are token ids
_ID_LISTS = {"token_ids", "tokens", "~ids", "~batch"}


def _in_id_list(loc: Sequence[int | str]) -> bool:
    return isinstance(loc[-1], int) and any(p in _ID_LISTS for p in loc)


def translate_validation_error(exc: ValidationError, prefix: Sequence[int | str] = (),
                               ) -> InvalidRequestError:
    """The first error, named by its path in the body (`prefix`: where the model validated
    sits in it)."""
    err = exc.errors(include_url=False)[0]
    kind = err["type"]
    loc = [*prefix, *(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("~")))]
    param = format_param(loc)
    if kind == "json_invalid":
        return InvalidRequestError(
            "We could not parse the JSON body of your request: "
            f"{err.get('ctx', {}).get('error', 'invalid JSON')}",
            code="invalid_json",
        )
    if kind == "model_type" and not loc:
        return InvalidRequestError("The request body must be a JSON object",
                                   code="invalid_type")
    if kind == "missing":
        return InvalidRequestError(f"Missing required parameter: '{param}'.", param=param,
                                   code="missing_required_parameter")
    if kind == "extra_forbidden":
        return InvalidRequestError(f"Unrecognized request argument supplied: {param}",
                                   param=param, code="unknown_parameter")
    message = f"Invalid value for '{param}': {err['msg']}" if param else err["msg"]
    if kind in _ID_ERRORS and _in_id_list(err["loc"]):
        return InvalidTokenIdError(
            f"Invalid token id at '{param}': token ids must be non-negative integers",
            param=param,
        )
    code = "invalid_type" if kind.endswith("_type") else "invalid_value"
    return InvalidRequestError(message, param=param, code=code)


def parse_body(body: bytes, model: type[M]) -> M:
    try:
        return model.model_validate_json(body or b"null")
    except ValidationError as exc:
        raise translate_validation_error(exc) from exc
