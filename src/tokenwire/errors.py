"""The one exception tree of tokenwire.

Every error a client can see is a `TokenwireError`: it carries the HTTP status, the OpenAI
error `type`, a machine-readable `code` and the `param` path of the culprit. The server has a
single handler that renders any of them as OpenAI's error body; the Python client raises the
same classes from an error body (`error_from_body`). The errors that stop a server from
serving as configured (`SetupError`) are in the same tree, told to the operator, never sent.

    TokenwireError
    ├── InvalidRequestError (400 invalid_request_error)
    │   ├── InvalidTokenIdError              invalid_token_id
    │   ├── TokenizerVersionRequiredError    tokenizer_version_required
    │   ├── UnknownTokenizerVersionError     unknown_tokenizer_version
    │   ├── TokenizerVersionMismatchError    tokenizer_version_mismatch
    │   ├── SpecialTokenNotAllowedError      special_token_not_allowed
    │   ├── NonCanonicalTokensError          non_canonical_tokens
    │   ├── ContextLengthExceededError       context_length_exceeded
    │   ├── ContentPolicyViolationError      content_policy_violation
    │   ├── UnsupportedParameterError        unsupported_parameter
    │   └── DuplicateIdError                 duplicate_id
    ├── AuthenticationError (401)            invalid_api_key
    ├── PermissionDeniedError (403)          admin_key_required
    ├── NotFoundError (404)
    │   ├── ModelNotFoundError               model_not_found
    │   ├── TokenizerNotFoundError           tokenizer_not_found
    │   ├── CompletionNotFoundError          completion_not_found
    │   ├── ResponseNotFoundError            response_not_found
    │   └── DocumentNotFoundError            document_not_found
    ├── MethodNotAllowedError (405)          method_not_allowed
    ├── RequestTooLargeError (413)           request_too_large
    ├── ConflictError (409)
    │   ├── WeightVersionUnavailableError    weight_version_unavailable: no replica within a bound
    │   └── RollingUpdateError               rolling_update_in_progress, fleet_paused
    ├── RateLimitError (429)                 queue_full
    ├── EngineError (503)                    engine_error
    │   └── EngineCrashedError               engine_crashed: the engine process died mid-request
    ├── StorageError (503)                   storage_unavailable
    ├── ServiceUnavailableError (503)        engine_unavailable
    │   └── ReplicaLostError                 (engines.base) a replica went away mid-response
    ├── ReplicaControlError (502)            replica_failed: a control call failed on a replica
    ├── SetupError (the server cannot serve as configured: told at start, never sent)
    │   ├── EngineStartError                 no upstream answered, or not the model configured
    │   ├── TokenizerParityError             the pinned tokenizer disagrees with the engine's
    │   ├── ModelSourceError                 a --model that names no model to serve
    │   └── TokenizerSourceError             files that describe no tokenizer we can pin
    │       ├── UnsupportedTokenizerError    a GGUF tokenizer with no portable equivalent yet
    │       └── GGUFFormatError              not a GGUF file this reader understands
    └── ClientError (raised by the Python client itself, never sent by a server)
        ├── APIConnectionError               connection_error
        └── TokenizerIntegrityError          tokenizer_integrity
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "APIConnectionError",
    "AuthenticationError",
    "ClientError",
    "ConflictError",
    "ContentPolicyViolationError",
    "ContextLengthExceededError",
    "EngineCrashedError",
    "EngineError",
    "EngineStartError",
    "GGUFFormatError",
    "InvalidRequestError",
    "InvalidTokenIdError",
    "KNOWN_CODES",
    "MethodNotAllowedError",
    "CompletionNotFoundError",
    "DocumentNotFoundError",
    "DuplicateIdError",
    "ModelNotFoundError",
    "ModelSourceError",
    "NonCanonicalTokensError",
    "NotFoundError",
    "PermissionDeniedError",
    "RateLimitError",
    "ReplicaControlError",
    "RequestTooLargeError",
    "ResponseNotFoundError",
    "RollingUpdateError",
    "ServiceUnavailableError",
    "SetupError",
    "SpecialTokenNotAllowedError",
    "StorageError",
    "TokenizerIntegrityError",
    "TokenizerNotFoundError",
    "TokenizerParityError",
    "TokenizerSourceError",
    "TokenizerVersionMismatchError",
    "TokenizerVersionRequiredError",
    "TokenwireError",
    "UnknownTokenizerVersionError",
    "UnsupportedTokenizerError",
    "UnsupportedParameterError",
    "WeightVersionUnavailableError",
    "error_from_body",
    "internal_error",
]


class TokenwireError(Exception):
    """Base of every error tokenwire reports to a client."""

    status_code: ClassVar[int] = 500
    error_type: ClassVar[str] = "server_error"
    default_code: ClassVar[str | None] = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 retry_after: int | None = None):
        """`retry_after`: seconds, sent as the `Retry-After` header (429s and 503s)."""
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code
        self.headers: dict[str, str] = {}
        if retry_after is not None:
            self.headers["Retry-After"] = str(retry_after)

    def to_body(self) -> dict[str, Any]:
        """OpenAI's error body: `{"error": {"message", "type", "param", "code"}}`."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, param={self.param!r}, code={self.code!r})"


class InvalidRequestError(TokenwireError):
    status_code = 400
    error_type = "invalid_request_error"


class DuplicateIdError(InvalidRequestError):
    """A record of that id is already stored (a `request_id` sent twice with `store`)."""

    default_code = "duplicate_id"


class InvalidTokenIdError(InvalidRequestError):
    default_code = "invalid_token_id"


class TokenizerVersionRequiredError(InvalidRequestError):
    default_code = "tokenizer_version_required"


class UnknownTokenizerVersionError(InvalidRequestError):
    default_code = "unknown_tokenizer_version"


class TokenizerVersionMismatchError(InvalidRequestError):
    default_code = "tokenizer_version_mismatch"


class SpecialTokenNotAllowedError(InvalidRequestError):
    default_code = "special_token_not_allowed"


class NonCanonicalTokensError(InvalidRequestError):
    default_code = "non_canonical_tokens"


class ContextLengthExceededError(InvalidRequestError):
    default_code = "context_length_exceeded"


class ContentPolicyViolationError(InvalidRequestError):
    default_code = "content_policy_violation"


class UnsupportedParameterError(InvalidRequestError):
    default_code = "unsupported_parameter"


class AuthenticationError(TokenwireError):
    status_code = 401
    error_type = "invalid_request_error"  # as OpenAI's
    default_code = "invalid_api_key"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message, param=param, code=code)
        self.headers["WWW-Authenticate"] = "Bearer"


class PermissionDeniedError(TokenwireError):
    """The caller is known but may not do this (the control plane wants an admin key)."""

    status_code = 403
    error_type = "permission_error"
    default_code = "admin_key_required"


class NotFoundError(TokenwireError):
    status_code = 404
    error_type = "invalid_request_error"
    default_code = "not_found"


class ModelNotFoundError(NotFoundError):
    default_code = "model_not_found"


class TokenizerNotFoundError(NotFoundError):
    default_code = "tokenizer_not_found"


class CompletionNotFoundError(NotFoundError):
    """No stored chat completion of that id (for this API key)."""

    default_code = "completion_not_found"


class ResponseNotFoundError(NotFoundError):
    """No stored response of that id (for this API key)."""

    default_code = "response_not_found"


class DocumentNotFoundError(NotFoundError):
    """No stored document of that id (for this API key)."""

    default_code = "document_not_found"


class MethodNotAllowedError(TokenwireError):
    status_code = 405
    error_type = "invalid_request_error"
    default_code = "method_not_allowed"


class RequestTooLargeError(TokenwireError):
    status_code = 413
    error_type = "invalid_request_error"
    default_code = "request_too_large"


class ConflictError(TokenwireError):
    """The request is well formed, but the server's state cannot take it now."""

    status_code = 409
    error_type = "invalid_request_error"
    default_code = "conflict"


class WeightVersionUnavailableError(ConflictError):
    """No replica serves weights within the request's staleness bound (`min_weight_version`,
    `max_staleness`, or the server's version policy), even after the wait: the message names the
    versions present."""

    default_code = "weight_version_unavailable"


class RollingUpdateError(ConflictError):
    """A rolling update cannot start: another runs, or the fleet is paused."""

    default_code = "rolling_update_in_progress"


class RateLimitError(TokenwireError):
    status_code = 429
    error_type = "rate_limit_error"
    default_code = "queue_full"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 retry_after: int | None = 1):
        super().__init__(message, param=param, code=code, retry_after=retry_after)


class EngineError(TokenwireError):
    """The engine failed while serving an accepted request; it recovers, so retry."""

    status_code = 503
    error_type = "server_error"
    default_code = "engine_error"


class EngineCrashedError(EngineError):
    """The embedded engine's process died while serving this request; it is being started
    again, so retry (`Retry-After`)."""

    default_code = "engine_crashed"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 retry_after: int | None = 1):
        super().__init__(message, param=param, code=code, retry_after=retry_after)


class StorageError(TokenwireError):
    """The store (the SQLite file, the PostgreSQL server) failed: nothing was acknowledged, so
    retry."""

    status_code = 503
    error_type = "server_error"
    default_code = "storage_unavailable"


class ReplicaControlError(TokenwireError):
    """A control-plane call (pause, weights, cache) failed on some replica: the body says
    which replica and what it answered (`replicas`), beside the error; the others did it."""

    status_code = 502
    error_type = "server_error"
    default_code = "replica_failed"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 replicas: list[dict[str, Any]] | None = None):
        super().__init__(message, param=param, code=code)
        self.replicas = replicas or []

    def to_body(self) -> dict[str, Any]:
        return {**super().to_body(), "replicas": self.replicas}


class ServiceUnavailableError(TokenwireError):
    status_code = 503
    error_type = "server_error"
    default_code = "engine_unavailable"


class SetupError(TokenwireError):
    """The server (or one upstream replica) cannot serve as configured: an operator's error,
    reported at start (or in /health), never sent to a client."""

    error_type = "server_error"


class EngineStartError(SetupError, RuntimeError):
    """The engine cannot serve: no upstream answered, or the upstream is not the model it was
    configured as."""


class TokenizerParityError(SetupError, RuntimeError):
    """The pinned tokenizer disagrees with the engine's own: serving would mislead clients."""


class ModelSourceError(SetupError, ValueError):
    """A configured model names nothing to serve: an unknown short name, a package that is not
    installed, two models under one name."""


class TokenizerSourceError(SetupError, ValueError):
    """The files do not describe a tokenizer tokenwire can pin."""


class UnsupportedTokenizerError(TokenizerSourceError):
    """The GGUF file's tokenizer has no portable equivalent here yet."""


class GGUFFormatError(TokenizerSourceError):
    """The file is not a GGUF file this reader understands."""


class ClientError(TokenwireError):
    """Raised by the client on its own side of the wire."""

    status_code = 0
    error_type = "client_error"


class APIConnectionError(ClientError):
    """The server could not be reached, or the connection broke."""

    default_code = "connection_error"


class TokenizerIntegrityError(ClientError):
    """A tokenizer artifact's bytes do not hash to the version they were fetched for."""

    default_code = "tokenizer_integrity"


def _leaf_classes(cls: type[TokenwireError]) -> list[type[TokenwireError]]:
    out = [cls]
    for sub in cls.__subclasses__():
        out.extend(_leaf_classes(sub))
    return out


_BY_CODE: dict[str, type[TokenwireError]] = {
    c.default_code: c for c in _leaf_classes(TokenwireError) if c.default_code is not None
}
#: the codes of the classes above: an error body with one of them came from a tokenwire server
KNOWN_CODES = frozenset(_BY_CODE)
#: the class of each status, for bodies whose code is not one of ours
_BY_STATUS: dict[int, type[TokenwireError]] = {
    400: InvalidRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    405: MethodNotAllowedError,
    409: ConflictError,
    413: RequestTooLargeError,
    429: RateLimitError,
    502: ReplicaControlError,
    503: ServiceUnavailableError,
}


def internal_error(what: str, exc: BaseException) -> TokenwireError:
    """An unexpected exception as a client hears of it: `internal_error`, naming only its class
    (the traceback is logged, never sent)."""
    return TokenwireError(f"{what}: {type(exc).__name__}", code="internal_error")


def error_from_body(status_code: int, body: Any) -> TokenwireError:
    """Rebuild the typed error a server sent (used by the client, and for in-band stream errors)."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        err = {"message": str(body)}
    code = err.get("code")
    cls = _BY_CODE.get(code) if isinstance(code, str) else None
    if cls is None:
        cls = _BY_STATUS.get(status_code, TokenwireError)
    exc = cls(str(err.get("message", "")), param=err.get("param"))
    exc.code = code if isinstance(code, str) else None  # as sent, even when absent
    return exc
