"""The server's own routes: /health, /v1/models, /metrics, /openapi.json,
/tokenize and /detokenize."""
