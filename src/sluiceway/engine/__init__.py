"""The engine: request state, scheduling, KV block accounting and the trio step loop.

Nothing in this package imports torch; the model is reached only through the
`ModelRunner` protocol in `batch.py`.

Other packages use the modules in `__all__` and nothing else of it
(`tests/test_import_layering.py` holds them to it): `engine` (the trio `Engine`)
and `core` (the synchronous `EngineCore` it drives), what crosses the engine's
edges (`batch`: the runner's contract; `outputs`, `sampling_params`, `pooling`,
`errors`, `kv_events`, `constraint`, `lora_modules`: the adapters served by
name), `arrivals` (the server marks requests being
prepared) and `step_threads` (the model thread a builder hands the engine). The
scheduler, block manager, sequences, detokenizer, hold-back, step placement and
watchdog are its own. The package imports nothing itself, so that the core loads
without trio.
"""

__all__ = [
    "arrivals",
    "batch",
    "constraint",
    "core",
    "engine",
    "errors",
    "kv_events",
    "lora_modules",
    "outputs",
    "pooling",
    "sampling_params",
    "step_threads",
]
