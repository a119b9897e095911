"""The engine: request state, scheduling, KV block accounting and the trio step loop.

Nothing in this package imports torch; the model is reached only through the
`ModelRunner` protocol in `batch.py`.
"""
