"""Offline generation for scripts: `LLM(model=...).generate(prompts, params)`."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from sluiceway.config import EngineConfig, ModelConfig
from sluiceway.engine.outputs import FinishReason
from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.hub import HubOptions, resolve_model
from sluiceway.model_engine import build_core, load_bundle

Prompt = str | Sequence[int]


@attrs.frozen
class CompletionOutput:
    index: int
    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None
    stop_reason: str | int | None = None


@attrs.frozen
class RequestOutput:
    prompt_token_ids: tuple[int, ...]
    outputs: tuple[CompletionOutput, ...]


class LLM:
    """A model and an engine core in this process, driven synchronously.

    `model=None` loads the embedded default model; `quantization="auto"` serves a
    GGUF stored quantized on the matching weight-only path on CPU (int4 for the
    default model), `"none"` unquantized, `"int8"` or `"int4"` as asked (see
    `ModelConfig`). Engine limits are the keyword arguments of `EngineConfig`
    (e.g. `max_num_seqs=32`). `tensor_parallel_size=N` splits the model over N
    rank processes, spawned on the calling thread (they end with it, with
    `close`, or at the latest when the interpreter exits). `model` may be a hub
    id (`ORG/NAME`, `ORG/NAME-GGUF:QUANT`), fetched into the Hugging Face cache at
    `revision` with `hf_token` (None: `HF_TOKEN`), or from the cache alone when
    `offline` (`sluiceway.hub`; it raises `HubError` when it cannot be had).
    """

    def __init__(
        self,
        model: str | None = None,
        dtype: str = "auto",
        quantization: str | None = "auto",
        attention_backend: str = "auto",
        enforce_eager: bool = False,
        tensor_parallel_size: int = 1,
        revision: str | None = None,
        hf_token: str | None = None,
        offline: bool = False,
        **engine_options: object,
    ) -> None:
        self.engine_config = EngineConfig(**engine_options)  # type: ignore[arg-type]
        resolved = resolve_model(model, HubOptions(revision=revision, token=hf_token, offline=offline))
        model_config = ModelConfig(
            model=resolved.path,
            served_model_name=resolved.served_name,
            dtype=dtype,  # type: ignore[arg-type]
            quantization=quantization,  # type: ignore[arg-type]
            attention_backend=attention_backend,  # type: ignore[arg-type]
            enforce_eager=enforce_eager,
            tensor_parallel_size=tensor_parallel_size,
            hf_token=hf_token,
            offline=offline,
        )
        self.bundle = load_bundle(model_config, self.engine_config)
        self.tokenizer = self.bundle.loaded.tokenizer
        self._core = build_core(self.bundle, self.engine_config)
        self._next_request_id = 0

    def close(self) -> None:
        """End the tensor-parallel ranks, if any (idempotent); the LLM cannot
        generate afterwards. With one device there is nothing to end."""
        close = getattr(self.bundle.runner, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """Token ids of a conversation rendered with the model's chat template."""
        text = self.tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def generate(
        self, prompts: Prompt | Sequence[Prompt], params: SamplingParams | None = None, n: int = 1
    ) -> list[RequestOutput]:
        """Run every prompt to completion, batched together; outputs in prompt order."""
        params = params or SamplingParams()
        batch: list[Prompt]
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            batch = [prompts]  # type: ignore[list-item]
        else:
            batch = list(prompts)  # type: ignore[arg-type]
        encoded = [self._encode(p) for p in batch]
        seq_ids = []
        for ids in encoded:
            seq_ids.append(self._core.add_request(self._next_request_id, ids, params, n))
            self._next_request_id += 1
        texts: dict[int, list[str]] = {s: [] for group in seq_ids for s in group}
        tokens: dict[int, list[int]] = {s: [] for s in texts}
        ends: dict[int, tuple[FinishReason | None, str | int | None]] = {}
        while self._core.has_work():
            for seq_id, delta in self._core.step():
                texts[seq_id].append(delta.text)
                tokens[seq_id].extend(delta.token_ids)
                if delta.finish_reason is not None:
                    ends[seq_id] = (delta.finish_reason, delta.stop_reason)
        return [
            RequestOutput(
                tuple(ids),
                tuple(
                    CompletionOutput(j, "".join(texts[s]), tuple(tokens[s]), *ends.get(s, (None, None)))
                    for j, s in enumerate(group)
                ),
            )
            for ids, group in zip(encoded, seq_ids, strict=True)
        ]

    def _encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return list(self.tokenizer.encode(prompt))
        return list(prompt)
