"""Wire models: the only definition of the API's bodies, used by server and client alike."""

from .chat import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChatMessage,
    ChoiceLogprobs,
    InputTokensBlock,
    ResponseMessage,
    TextBlock,
)
from .common import (
    ErrorInfo,
    ErrorResponse,
    LogprobEntry,
    ModelCard,
    ModelList,
    StreamOptions,
    TokenLogprob,
    Usage,
)

__all__ = [
    "ChatChoice",
    "ChatChunkChoice",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatDelta",
    "ChatMessage",
    "ChoiceLogprobs",
    "ErrorInfo",
    "ErrorResponse",
    "InputTokensBlock",
    "LogprobEntry",
    "ModelCard",
    "ModelList",
    "ResponseMessage",
    "StreamOptions",
    "TextBlock",
    "TokenLogprob",
    "Usage",
]
