"""The Python client: `Client` and `AsyncClient` (httpx), on tokenwire's own protocol models."""

from ._client import DEFAULT_BASE_URL, AsyncClient, Client
from ._streaming import AsyncStream, Stream
from ._tokenizers import TokenizerCache

__all__ = ["DEFAULT_BASE_URL", "AsyncClient", "AsyncStream", "Client", "Stream", "TokenizerCache"]
