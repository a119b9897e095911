"""`python -m sluiceway.runner.tensor_parallel.remote [model and engine flags]`: a rank
on another machine, joining the ranks of a `sluiceway serve` started with the same
model and engine flags and `--tensor-parallel-size`.

It reads the torchrun-style variables: RANK (1 or more: rank 0 runs beside the
API process), WORLD_SIZE, MASTER_ADDR, MASTER_PORT (default 29500), LOCAL_RANK
(its GPU; default 0) and LOCAL_WORLD_SIZE (ranks on this machine, to share the
CPU cores; default 1). It runs until the ranks shut down or fail; it has no
parent to watch: when rank 0's process ends, its collectives fail and it exits.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence

from sluiceway.flags import add_engine_flags, add_model_flags, engine_config, model_config
from sluiceway.hub import HubError, add_hub_flags, hub_options, resolve_model
from sluiceway.runner.tensor_parallel.launch import DEFAULT_MASTER_PORT, rank_spec
from sluiceway.runner.tensor_parallel.rank import run_rank


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] = os.environ) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluiceway.runner.tensor_parallel.remote")
    add_model_flags(parser)
    add_hub_flags(parser)
    add_engine_flags(parser)
    args = parser.parse_args(argv)
    try:
        rank, world = int(environ["RANK"]), int(environ["WORLD_SIZE"])
        addr = environ["MASTER_ADDR"]
    except (KeyError, ValueError) as exc:
        parser.error(f"set RANK, WORLD_SIZE and MASTER_ADDR ({exc})")
    if not 1 <= rank < world or world != args.tensor_parallel_size:
        parser.error(
            f"RANK={rank} must be 1 .. WORLD_SIZE-1, and WORLD_SIZE={world} equal "
            f"--tensor-parallel-size {args.tensor_parallel_size}"
        )
    import torch

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:  # a hub id: fetched into this machine's cache, as the server fetched it
        args.model = resolve_model(args.model, hub_options(args)).path
    except HubError as exc:
        parser.error(str(exc))
    spec = rank_spec(
        model_config(args),
        engine_config(args),
        init_method=f"tcp://{addr}:{int(environ.get('MASTER_PORT', DEFAULT_MASTER_PORT))}",
        device="cuda" if torch.cuda.is_available() else "cpu",
        local_ranks=int(environ.get("LOCAL_WORLD_SIZE", 1)),
    )
    run_rank(spec, rank, local_rank=int(environ.get("LOCAL_RANK", 0)), commands=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
