"""Adding and removing LoRA adapters while serving (vLLM's endpoints)."""
