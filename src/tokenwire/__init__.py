"""tokenwire: a token-native, OpenAI-compatible LLM API server.

Prompts can be token ids and responses carry the exact ids the model sampled, pinned to a
content-addressed tokenizer version. `tokenwire serve` runs the server; the wire models live in
`tokenwire.protocol`, shared by the server and the Python client.
"""

from __future__ import annotations

from .client import AsyncClient, Client
from .config import Settings
from .errors import (
    APIConnectionError,
    AuthenticationError,
    ClientError,
    ContentPolicyViolationError,
    ContextLengthExceededError,
    EngineError,
    InvalidRequestError,
    InvalidTokenIdError,
    MethodNotAllowedError,
    ModelNotFoundError,
    NonCanonicalTokensError,
    NotFoundError,
    RateLimitError,
    RequestTooLargeError,
    ServiceUnavailableError,
    SpecialTokenNotAllowedError,
    TokenizerIntegrityError,
    TokenizerNotFoundError,
    TokenizerVersionMismatchError,
    TokenizerVersionRequiredError,
    TokenwireError,
    UnknownTokenizerVersionError,
    UnsupportedParameterError,
)

__version__ = "0.1.0"

__all__ = [
    "APIConnectionError",
    "AsyncClient",
    "AuthenticationError",
    "Client",
    "ClientError",
    "ContentPolicyViolationError",
    "ContextLengthExceededError",
    "EngineError",
    "InvalidRequestError",
    "InvalidTokenIdError",
    "MethodNotAllowedError",
    "ModelNotFoundError",
    "NonCanonicalTokensError",
    "NotFoundError",
    "RateLimitError",
    "RequestTooLargeError",
    "ServiceUnavailableError",
    "Settings",
    "SpecialTokenNotAllowedError",
    "TokenizerIntegrityError",
    "TokenizerNotFoundError",
    "TokenizerVersionMismatchError",
    "TokenizerVersionRequiredError",
    "TokenwireError",
    "UnknownTokenizerVersionError",
    "UnsupportedParameterError",
    "__version__",
]
