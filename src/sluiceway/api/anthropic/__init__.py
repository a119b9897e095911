"""Anthropic's Messages API surface (POST /v1/messages, /v1/messages/count_tokens):
a Messages request translated into a chat request and run by the shared
generation pipeline, its output written as Anthropic's content blocks and
stream events, its errors in Anthropic's shape."""
