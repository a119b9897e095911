"""The model families the runner serves: one module a family (its config
mapping, its checkpoint's weight names and its layer), a shared decoder that runs
any of them, and the registry that picks the family from a transformers config."""
