import sys
from pathlib import Path
from typing import Any

import pytest

# grammar_runner.py sits in tests/; importlib mode does not put it on sys.path.
sys.path.insert(0, str(Path(__file__).parents[1]))

from sluiceway.grammar.compiler import GrammarCompiler


@pytest.fixture(scope="session")
def compiler(tokenizer: Any) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, [tokenizer.eos_token_id])
