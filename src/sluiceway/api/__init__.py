"""The OpenAI-compatible HTTP layer: a quart-trio app on hypercorn's trio worker.

Entry points: `sluiceway.api.app.create_app` (the app around an engine),
`sluiceway.api.serve.serve_async` (app + engine loop + drain, inside a nursery) and
`sluiceway.api.serve.serve` (load the model and run until SIGTERM/SIGINT).
"""
