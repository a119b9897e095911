"""The Batch API surface: /v1/files, /v1/batches, the batch store and the runner
that answers their lines at background priority."""
