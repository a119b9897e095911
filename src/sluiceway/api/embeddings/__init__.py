"""The embeddings surface (POST /v1/embeddings)."""
