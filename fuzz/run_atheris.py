"""Coverage-guided fuzzing of one target with atheris, for a bounded time.

    python fuzz/run_atheris.py request_json --seconds 60 [--corpus DIR]
    python fuzz/run_atheris.py all --seconds 60      # each target in turn (subprocesses)

Crashes are written as crash-* files into results/fuzz/<target>/ (libFuzzer's
-artifact_prefix); exit status non-zero on a finding.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

SEEDS = {
    "request_json": [
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2, "stream": True,
         "stream_options": {"include_usage": True}, "max_tokens": 5, "stop": ["a"], "top_p": 0.5},
        {"prompt": ["a", [1, 2]], "echo": True, "logprobs": 2, "logit_bias": {"5": 1.0},
         "max_completion_tokens": 3, "temperature": 0, "seed": 1},
    ],
    "chat_render": [
        [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "t"}]}],
        [[{"role": "user", "content": "a"}], [{"role": "assistant", "content": None}]],
        "plain text prompt",
    ],
    "sse": [{"choices": [{"delta": {"content": "a\nb\r\u2028"}}]}, ["x", 1, 2.5, None, True]],
    "detokenizer": None,
}


def _seed_corpus(target: str, corpus: Path) -> None:
    corpus.mkdir(parents=True, exist_ok=True)
    seeds = SEEDS[target]
    if seeds is None:
        (corpus / "seed0").write_bytes(bytes([0x81, 5, 200, 226, 130, 172, 101, 102]))
        return
    for i, seed in enumerate(seeds):
        (corpus / f"seed{i}").write_bytes(json.dumps(seed).encode())


def run_one(target: str, seconds: int, corpus: Path | None) -> int:
    import atheris

    with atheris.instrument_imports(include=["sluiceway"]):
        sys.path.insert(0, str(HERE))
        import targets

    fn = targets.TARGETS[target]
    out = REPO / "results" / "fuzz" / target
    out.mkdir(parents=True, exist_ok=True)
    corpus = corpus or out / "corpus"
    _seed_corpus(target, corpus)
    if target in ("chat_render", "detokenizer"):
        targets.tokenizer()  # load before fuzzing starts
    argv = [sys.argv[0], str(corpus), f"-max_total_time={seconds}", f"-artifact_prefix={out}/",
            "-max_len=4096", "-timeout=20", "-rss_limit_mb=4096"]
    atheris.Setup(argv, fn)
    atheris.Fuzz()
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("target", choices=[*SEEDS, "all"])
    p.add_argument("--seconds", type=int, default=60)
    p.add_argument("--corpus", type=Path, default=None)
    args = p.parse_args()
    if args.target != "all":
        return run_one(args.target, args.seconds, args.corpus)
    failed = []
    for target in SEEDS:
        print(f"== fuzzing {target} for {args.seconds} s", flush=True)
        cmd = [sys.executable, __file__, target, "--seconds", str(args.seconds)]
        if subprocess.run(cmd, timeout=args.seconds + 300).returncode != 0:
            failed.append(target)
    print("findings in: " + (", ".join(failed) if failed else "none"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
