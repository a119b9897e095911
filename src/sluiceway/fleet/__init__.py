"""Running as one replica of many behind `vllm-router`: the KV-event publisher and
its configuration. Nothing here is imported by the engine; the server wires it in."""
