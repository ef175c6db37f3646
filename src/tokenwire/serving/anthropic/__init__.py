"""Anthropic's Messages API on the chat service: the request translated (input.py), the
choice's items rendered as content blocks and its events (service.py)."""

from .service import MessagesService, error_body

__all__ = ["MessagesService", "error_body"]
