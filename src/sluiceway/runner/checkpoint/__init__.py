"""Reading model checkpoints (GGUF, safetensors) a tensor at a time, straight
into the runner's layout, without a framework model in between."""
