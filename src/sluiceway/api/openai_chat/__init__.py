"""The OpenAI chat completions and completions surface (POST /v1/chat/completions,
POST /v1/completions)."""
