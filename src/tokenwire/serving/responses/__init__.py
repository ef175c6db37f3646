"""OpenAI's Responses API on the chat service: the request translated (input.py), the
choice's items rendered as its events (service.py), responses kept and continued by id
(stored_responses.py)."""

from .service import ResponsesService
from .stored_responses import StoredResponses

__all__ = ["ResponsesService", "StoredResponses"]
