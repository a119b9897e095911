"""What belongs to an API key: the owner of stored objects and the per-key budgets."""
