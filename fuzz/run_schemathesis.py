"""schemathesis against /openapi.json of a fake-runner server subprocess (no model):
no 5xx, status codes, content types and bodies match the schema.

    python fuzz/run_schemathesis.py --seconds 60 [--phases examples,coverage,fuzzing,stateful]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "load_tests"))
from load_server import ServerProcess  # noqa: E402
from run_load import save_default_tokenizer  # noqa: E402

CHECKS = "not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=int, default=60)
    p.add_argument("--phases", default="examples,coverage,fuzzing")
    p.add_argument("--out", default=str(REPO / "results" / "fuzz" / "schemathesis"))
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tok = save_default_tokenizer(Path(tmp) / "tokenizer")
        with ServerProcess.fake(tok, ["--request-timeout", "5"], out / "server.log") as server:
            cmd = [str(Path(sys.executable).parent / "schemathesis"), "run", server.url + "/openapi.json",
                   "--checks", CHECKS, "--phases", args.phases, "--max-time", str(args.seconds),
                   "-w", "2", "--request-timeout", "20", "--report", "junit", "--report-dir", str(out)]
            return subprocess.run(cmd, cwd=out, timeout=args.seconds + 300).returncode


if __name__ == "__main__":
    sys.exit(main())
