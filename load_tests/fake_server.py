"""A sluiceway server over a scripted fake runner: the real HTTP layer, engine,
scheduler, KV block manager and tokenizer, with no model. Fast and deterministic,
for the short load run, the SIGTERM test and schemathesis.

    python load_tests/fake_server.py --tokenizer DIR [--port 0] [--step-delay 0.002]

Prints `LISTENING <url>` on stdout once it accepts connections; SIGTERM drains.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from functools import partial

import attrs
import trio

from sluiceway.api.serve import serve_async
from sluiceway.config import EngineConfig, ServerConfig
from sluiceway.engine.batch import SampledToken, StepBatch
from sluiceway.engine.engine import Engine
from sluiceway.fleet.kv_events_config import KVEventsConfig

WORDS = (" the", " river", " flows", " under", " a", " quiet", " bridge", " and", " on")


@attrs.define
class PacedRunner:
    """Next token = vocab[(last + position) % len]; every 13th sequence ends with EOS
    after 5 tokens. `step_delay` is simulated model time (in the worker thread)."""

    vocab: tuple[int, ...]
    eos: int
    num_blocks: int
    block_size: int = 16
    step_delay: float = 0.0
    _sampled: dict[int, int] = attrs.field(factory=dict)

    def step(self, batch: StepBatch) -> list[SampledToken]:
        if self.step_delay:
            time.sleep(self.step_delay)
        out = []
        for c in batch.chunks:
            if not c.sample:
                continue
            count = self._sampled[c.seq_id] = self._sampled.get(c.seq_id, 0) + 1
            if c.seq_id % 13 == 12 and count > 5:
                token = self.eos
            else:
                position = c.start_pos + len(c.token_ids)
                token = self.vocab[(c.token_ids[-1] + position) % len(self.vocab)]
            out.append(SampledToken(c.seq_id, token, -0.5, ()))
        return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--tokenizer", required=True, help="a tokenizer directory")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--step-delay", type=float, default=0.0)
    p.add_argument("--num-kv-blocks", type=int, default=1024)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-waiting", type=int, default=256)
    p.add_argument("--request-timeout", type=float, default=None)
    p.add_argument("--drain-grace", type=float, default=30.0)
    p.add_argument("--keep-alive-timeout", type=float, default=5.0)
    p.add_argument("--send-stall-timeout", type=float, default=30.0)
    p.add_argument("--kv-events-config", default=None, help="as `sluiceway serve` takes it (JSON)")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    vocab = tuple(tokenizer.encode(w, add_special_tokens=False)[0] for w in WORDS)
    runner = PacedRunner(vocab, tokenizer.eos_token_id, args.num_kv_blocks, step_delay=args.step_delay)
    engine = Engine(
        runner,
        tokenizer,
        EngineConfig(max_num_seqs=args.max_num_seqs, max_waiting=args.max_waiting),
        eos_token_ids={tokenizer.eos_token_id},
        max_model_len=2048,
    )
    config = ServerConfig(
        host="127.0.0.1",
        port=args.port,
        request_timeout=args.request_timeout,
        drain_grace_seconds=args.drain_grace,
        keep_alive_timeout=args.keep_alive_timeout,
        send_stall_timeout=args.send_stall_timeout,
        kv_events=KVEventsConfig.from_json(args.kv_events_config) if args.kv_events_config else None,
    )

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            server = await nursery.start(
                partial(serve_async, engine, server_config=config, model_name="test-model", handle_signals=True)
            )
            print(f"LISTENING {server.url}", flush=True)

    trio.run(run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
