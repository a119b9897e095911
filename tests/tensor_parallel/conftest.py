import shutil
from pathlib import Path

import pytest
from tp_helpers import tiny_llama


@pytest.fixture(scope="session")
def model_dir(tokenizer, tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama (4 query heads, 2 KV heads) over the default tokenizer, as a
    Hugging Face model directory that `--model` and the ranks load."""
    path = tmp_path_factory.mktemp("tiny-llama")
    tiny_llama(kv_heads=2, vocab=len(tokenizer)).save_pretrained(path)
    for item in tokenizer_dir.iterdir():
        shutil.copy(item, path / item.name)
    return path
