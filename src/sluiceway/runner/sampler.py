"""Batched next-token selection for the rows a step samples.

Order of logit processing, per row: logit_bias, repetition penalty (HF semantics,
over prompt + output tokens), presence/frequency penalties (OpenAI semantics, over
output tokens), suppressed ids to -inf, tokens a row's grammar forbids to -inf, then for sampled rows temperature, top-k,
top-p and min-p. Greedy rows (temperature 0) take the argmax. Log-probabilities
are always taken from the RAW logits.

A sampled row draws with an exponential race (argmax of p / E, E ~ Exp(1)) whose
noise comes from a generator seeded with that row's `step_seed` alone, and every
batched op here is row-wise, so a row's token depends only on its own logits and
seed, never on what else shares the batch.

On a GPU the logits stay on the device: host lists become device tensors through
non-blocking copies, and the sampled token ids, their log-probabilities and any
requested top-k alternatives come back in one transfer, the step's only sync.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from sluiceway.engine.batch import SampledToken, ScheduledChunk
from sluiceway.engine.constraint import TokenMasks
from sluiceway.runner.native.logit_stats import argmax_logsumexp

_SEED_MASK = (1 << 63) - 1


def _on(device: torch.device, values: Sequence, dtype: torch.dtype) -> torch.Tensor:
    """`values` as a tensor on `device`. A plain `torch.tensor(..., device=cuda)`
    synchronises the stream; a non-blocking copy from pageable host memory is
    staged at once and does not wait for the device."""
    host = torch.tensor(values, dtype=dtype)
    return host if device.type == "cpu" else host.to(device, non_blocking=True)


def _to_host(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """`tensors` on the CPU, waiting for the device once for all of them."""
    device = tensors[0].device
    if device.type != "cuda":
        return [t.cpu() for t in tensors]
    # Non-blocking device-to-host copies land in pinned memory and are complete
    # only after the sync below.
    host = [t.to("cpu", non_blocking=True) for t in tensors]
    torch.cuda.current_stream(device).synchronize()
    return host


def _apply_bias_and_suppression(logits: torch.Tensor, chunks: Sequence[ScheduledChunk]) -> None:
    rows, cols, vals = [], [], []
    sup_rows, sup_cols = [], []
    vocab = logits.shape[1]
    for r, c in enumerate(chunks):
        for tok, bias in c.params.logit_bias:
            if 0 <= tok < vocab:
                rows.append(r)
                cols.append(tok)
                vals.append(bias)
        for tok in c.suppressed_token_ids:
            if 0 <= tok < vocab:
                sup_rows.append(r)
                sup_cols.append(tok)
    dev = logits.device
    if rows:
        idx = (_on(dev, rows, torch.int64), _on(dev, cols, torch.int64))
        logits.index_put_(idx, _on(dev, vals, logits.dtype), accumulate=True)
    if sup_rows:
        logits[_on(dev, sup_rows, torch.int64), _on(dev, sup_cols, torch.int64)] = float("-inf")


def _apply_penalties(logits: torch.Tensor, chunks: Sequence[ScheduledChunk]) -> None:
    """Penalise in place the rows whose params ask for it (rows are few; the work is batched)."""
    wanted = [r for r, c in enumerate(chunks) if c.params.needs_penalties]
    if not wanted:
        return
    dev, vocab = logits.device, logits.shape[1]
    wanted_rows = _on(dev, wanted, torch.int64)
    sub = logits[wanted_rows]
    out_rows: list[int] = []
    out_cols: list[int] = []
    seen_rows: list[int] = []
    seen_cols: list[int] = []
    for i, r in enumerate(wanted):
        c = chunks[r]
        outs = [t for t in c.output_token_ids if 0 <= t < vocab]
        out_rows.extend([i] * len(outs))
        out_cols.extend(outs)
        if c.params.repetition_penalty != 1.0:
            seen = {t for t in c.prompt_token_ids if 0 <= t < vocab}.union(outs)
            seen_rows.extend([i] * len(seen))
            seen_cols.extend(seen)
    params = [chunks[r].params for r in wanted]
    if seen_rows:
        rep = _on(dev, [p.repetition_penalty for p in params], sub.dtype)[:, None]
        seen_mask = torch.zeros_like(sub, dtype=torch.bool)
        seen_mask[_on(dev, seen_rows, torch.int64), _on(dev, seen_cols, torch.int64)] = True
        penalised = torch.where(sub > 0, sub / rep, sub * rep)
        sub = torch.where(seen_mask, penalised, sub)
    if out_rows:
        counts = torch.zeros_like(sub)
        ones = torch.ones(len(out_rows), device=dev, dtype=sub.dtype)
        counts.index_put_(
            (_on(dev, out_rows, torch.int64), _on(dev, out_cols, torch.int64)),
            ones,
            accumulate=True,
        )
        freq = _on(dev, [p.frequency_penalty for p in params], sub.dtype)[:, None]
        pres = _on(dev, [p.presence_penalty for p in params], sub.dtype)[:, None]
        sub = sub - freq * counts - pres * (counts > 0).to(sub.dtype)
    logits[wanted_rows] = sub


_BIT = torch.tensor([1 << i for i in range(31)] + [-(1 << 31)], dtype=torch.int32)


def _allowed(packed: np.ndarray, width: int, device: torch.device) -> torch.Tensor:
    """The bools `[rows, width]` of int32 bitmasks (bit t % 32 of word t // 32 is
    token t). On the CPU numpy unpacks the bytes (x86 is little-endian, so byte
    t // 8 holds token t at bit t % 8), several times faster than torch's
    shift-and-compare. On a GPU the packed
    bits go over (an eighth of the bools' size) and are unpacked there."""
    if device.type == "cpu":
        unpacked = np.unpackbits(packed.view(np.uint8), axis=1, count=width, bitorder="little")
        return torch.from_numpy(unpacked.view(np.bool_))
    bits = torch.from_numpy(packed).to(device, non_blocking=True)
    # int32 arithmetic: bit 31 is the sign bit (the negative entry of `_BIT`).
    allowed = (bits.unsqueeze(-1) & _BIT.to(device, non_blocking=True)).ne(0)
    return allowed.view(len(packed), -1)[:, :width]


def _apply_token_masks(logits: torch.Tensor, masks: TokenMasks) -> None:
    """Forbidden tokens of the masked rows to -inf, in place, in one batched op.

    Waits for the masks (they were filled while the model ran). Columns beyond
    the mask's vocabulary (a model's padded output rows) are forbidden too."""
    packed = masks.wait()
    vocab = logits.shape[1]
    width = min(vocab, packed.shape[1] * 32)
    forbid = _allowed(packed, width, logits.device).logical_not()
    if width < vocab:
        forbid = torch.nn.functional.pad(forbid, (0, vocab - width), value=True)
    if masks.rows == tuple(range(logits.shape[0])):
        logits.masked_fill_(forbid, float("-inf"))  # every row: no gather and scatter
        return
    rows = _on(logits.device, list(masks.rows), torch.int64)
    logits[rows] = logits[rows].masked_fill(forbid, float("-inf"))


def _filter(logits: torch.Tensor, chunks: Sequence[ScheduledChunk]) -> torch.Tensor:
    """Temperature, top-k, top-p, min-p for sampled rows; returns probabilities."""
    params = [c.params for c in chunks]
    dev, dtype = logits.device, logits.dtype
    temps = _on(dev, [p.temperature for p in params], dtype)[:, None]
    logits = logits / temps
    vocab = logits.shape[1]
    top_ks = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    top_ps = [p.top_p for p in params]
    if any(k < vocab for k in top_ks) or any(p < 1.0 for p in top_ps):
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=dev)[None, :]
        drop = ranks >= _on(dev, top_ks, torch.int64)[:, None]
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the mass strictly before it already reaches top_p; keeps >= 1.
        before = probs.cumsum(dim=-1) - probs
        drop = before >= _on(dev, top_ps, dtype)[:, None]
        drop[:, 0] = False
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(1, order, sorted_logits)
    probs = logits.softmax(dim=-1)
    min_ps = [p.min_p for p in params]
    if any(m > 0.0 for m in min_ps):
        threshold = _on(dev, min_ps, dtype)[:, None] * probs.amax(dim=-1, keepdim=True)
        probs = probs.masked_fill(probs < threshold, 0.0)
    return probs


def _draw(probs: torch.Tensor, chunks: Sequence[ScheduledChunk]) -> torch.Tensor:
    """Exponential race per row, each row's noise from its own seeded generator.

    One generator reseeded per row draws exactly what a fresh generator per row
    would (`manual_seed` resets the whole state, CUDA's offset included)."""
    noise = torch.empty_like(probs)
    gen = torch.Generator(device=probs.device)
    for r, c in enumerate(chunks):
        gen.manual_seed(c.step_seed & _SEED_MASK)
        noise[r].exponential_(generator=gen)
    return (probs / noise).max(dim=-1).indices


# Rows per block in `_argmax_and_logsumexp`: 4 x 49152 float32 logits (768 KiB)
# stay in L2 across the block's four passes.
_ROW_BLOCK = 4


def _argmax_and_logsumexp(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: index of the first maximum (as `argmax`) and logsumexp.

    Done a few rows at a time because the whole `[S, vocab]` tensor is far larger
    than the caches and each full pass re-reads it from memory; block by block the
    max, shift, exp and sum passes hit L2, several times faster with caches cold.
    (`max` rather than `argmax`: same index, and
    `argmax`'s reduction does not vectorize on CPU.) On a GPU a loop of small
    launches would cost more than it saves, so the whole tensor goes at once."""
    if logits.device.type != "cpu":
        return logits.max(dim=-1).indices, torch.logsumexp(logits, dim=-1)
    # The C kernel does both in two passes per row without temporaries (about 5x
    # faster again at 32 rows); the loop below is its fallback.
    native = argmax_logsumexp(logits)
    if native is not None:
        return native
    indices, lse = [], []
    for block in logits.split(_ROW_BLOCK):
        values, idx = block.max(dim=-1)
        shift = torch.where(values.isfinite(), values, torch.zeros_like(values))
        total = (block - shift[:, None]).exp_().sum(dim=-1)
        indices.append(idx)
        lse.append(total.log_() + shift)
    return torch.cat(indices), torch.cat(lse)


def _top_logprobs(
    logits: torch.Tensor, chunks: Sequence[ScheduledChunk]
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Raw log-probabilities and ids `[W, k]` of the top k alternatives for the W
    rows that ask for any (k = the largest request, in row order); None if none do."""
    wanted = [r for r, c in enumerate(chunks) if c.params.logprobs]
    if not wanted:
        return None
    k = max(chunks[r].params.logprobs or 0 for r in wanted)
    logprobs = torch.log_softmax(logits[_on(logits.device, wanted, torch.int64)], dim=-1)
    values, ids = logprobs.topk(min(k, logits.shape[1]), dim=-1)
    return values, ids


def _unpack_tops(
    host: Sequence[torch.Tensor], chunks: Sequence[ScheduledChunk]
) -> list[tuple[tuple[int, float], ...]]:
    """Each row's `(id, logprob)` alternatives from `_top_logprobs`'s `host` copy."""
    tops: list[tuple[tuple[int, float], ...]] = [()] * len(chunks)
    if not host:
        return tops
    values, ids = host[0].tolist(), host[1].tolist()
    wanted = [r for r, c in enumerate(chunks) if c.params.logprobs]
    for i, r in enumerate(wanted):
        n = chunks[r].params.logprobs
        tops[r] = tuple(zip(ids[i][:n], values[i][:n], strict=True))
    return tops


def sample(
    logits: torch.Tensor, chunks: Sequence[ScheduledChunk], token_masks: TokenMasks | None = None
) -> list[SampledToken]:
    """Pick one token per row of `logits` (`[S, vocab]`, float32, row r belongs to
    `chunks[r]`); in the rows of `token_masks`, only tokens their masks allow. Does
    not modify `logits`."""
    raw = logits
    needs_processing = token_masks is not None or any(
        c.params.logit_bias or c.suppressed_token_ids or c.params.needs_penalties for c in chunks
    )
    processed = raw.clone() if needs_processing else raw
    if needs_processing:
        _apply_bias_and_suppression(processed, chunks)
        _apply_penalties(processed, chunks)
        if token_masks is not None:
            _apply_token_masks(processed, token_masks)
    tokens, lse = _argmax_and_logsumexp(raw)
    if needs_processing:
        tokens = processed.max(dim=-1).indices
    sampled = [r for r, c in enumerate(chunks) if not c.params.greedy]
    if sampled:
        sampled_chunks = [chunks[r] for r in sampled]
        rows = _on(raw.device, sampled, torch.int64)
        probs = _filter(processed[rows], sampled_chunks)
        tokens[rows] = _draw(probs, sampled_chunks)
    # The sampled tokens' raw log-probabilities: SampledToken always carries one,
    # and on a GPU these few floats ride in the same transfer as the ids.
    chosen = raw.gather(1, tokens[:, None])[:, 0] - lse
    tops = _top_logprobs(raw, chunks)
    host = _to_host([tokens, chosen, *(tops or ())])
    ids, logprobs, top_lists = host[0].tolist(), host[1].tolist(), _unpack_tops(host[2:], chunks)
    return [
        SampledToken(seq_id=c.seq_id, token_id=t, logprob=lp, top_logprobs=top)
        for c, t, lp, top in zip(chunks, ids, logprobs, top_lists, strict=True)
    ]
