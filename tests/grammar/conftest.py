from typing import Any

import pytest

from sluiceway.grammar.compiler import GrammarCompiler


@pytest.fixture(scope="session")
def compiler(tokenizer: Any) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, [tokenizer.eos_token_id])
