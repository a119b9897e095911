"""sluiceway.client: a trio client for sluiceway and any OpenAI-compatible server.

Light on purpose: it imports trio, httpx, httpx-sse and attrs, never torch,
transformers or the server. See ``docs/client.md``.

    from sluiceway.client import AsyncClient

    async with AsyncClient("http://127.0.0.1:8000") as client:
        reply = await client.chat.completions.create(model=..., messages=[...])
        async with await client.chat.completions.create(..., stream=True) as stream:
            async for chunk in stream: ...
        async with client.stream_choices(model=..., messages=[conv1, conv2]) as choices:
            ...  # one consumer task per choice
        results = await client.run_many([...], max_concurrency=8)
"""

from sluiceway.client._client import DEFAULT, DEFAULT_TIMEOUT, DEFAULT_URL, AsyncClient
from sluiceway.client._fanout import (
    ChatCall,
    ChoiceStream,
    ChoiceStreams,
    CompletionCall,
    Result,
)
from sluiceway.client._retry import RetryPolicy
from sluiceway.client._streaming import Stream
from sluiceway.client.errors import (
    APIConnectionError,
    APIError,
    APIStatusError,
    APIStreamError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    InternalServerError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitedError,
    RateLimitError,
    ResponseFormatError,
    ServerUnavailableError,
    StreamInterruptedError,
    UnprocessableEntityError,
)

__all__ = [
    "DEFAULT",
    "DEFAULT_TIMEOUT",
    "DEFAULT_URL",
    "APIConnectionError",
    "APIError",
    "APIStatusError",
    "APIStreamError",
    "APITimeoutError",
    "AsyncClient",
    "AuthenticationError",
    "BadRequestError",
    "ChatCall",
    "ChoiceStream",
    "ChoiceStreams",
    "CompletionCall",
    "InternalServerError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RateLimitError",
    "RateLimitedError",
    "ResponseFormatError",
    "Result",
    "RetryPolicy",
    "ServerUnavailableError",
    "Stream",
    "StreamInterruptedError",
    "UnprocessableEntityError",
]
