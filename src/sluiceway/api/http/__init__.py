"""HTTP plumbing every surface shares: OpenAI-style errors, JSON and SSE bodies,
request bodies and uploads, and the socket-level stream output. Knows nothing of
models or generation."""
