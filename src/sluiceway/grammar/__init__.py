"""Constrained decoding: what a choice's output must match, compiled into per-token
masks by llguidance (docs/structured-outputs.md, "Why llguidance", says why).

`spec` says what to constrain to (JSON Schema, regex, a Lark grammar, tool calls)
in plain data; `compiler` turns a spec into a grammar whose matchers follow one
choice's tokens; `thinking` starts a grammar after a reasoning model's
thinking (and forces the closing tag when a thinking budget runs out); `masks`
fills the next-token masks of a step's constrained rows on a thread of its own
while the model runs. Nothing here imports torch or trio.
"""
