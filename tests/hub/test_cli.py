"""Hub ids on the command line (`serve ORG/NAME`, `--model ORG/NAME`, the name a
hub model is served under, one-line errors) and in the offline `LLM`."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from hub_stand_in import StandInHub

from sluiceway import cli
from sluiceway.flags import model_config
from sluiceway.hub import HubError

FILES = {
    "config.json": b'{"model_type": "llama"}',
    "tokenizer.json": b"{}",
    "model.safetensors": b"weights",
}


def _resolved(argv: list[str]) -> argparse.Namespace:
    args = cli.build_parser().parse_args(argv)
    cli._resolve_model(args)
    return args


def test_serve_takes_the_model_as_its_argument_and_serves_it_under_the_id(hub: StandInHub, hf_home):
    repo = hub.add_repo("org/tiny", FILES)
    snapshot = hf_home / "hub" / "models--org--tiny" / "snapshots" / repo.commit
    args = _resolved(["serve", "org/tiny"])
    assert args.model == str(snapshot)
    assert model_config(args).served_model_name == "org/tiny"
    args = _resolved(["serve", "--model", "org/tiny", "--served-model-name", "tiny"])
    assert (args.model, model_config(args).served_model_name) == (str(snapshot), "tiny")
    with pytest.raises(HubError, match=r"^two models given: org/tiny and --model org/other$"):
        _resolved(["serve", "org/tiny", "--model", "org/other"])
    # The default model and a local path are left to the loader, named by it.
    args = _resolved(["serve"])
    assert (args.model, args.served_model_name) == (None, None)
    args = _resolved(["serve", str(snapshot)])
    assert (args.model, args.served_model_name) == (str(snapshot), None)


def test_revision_token_and_offline_flags_reach_the_fetch(hub: StandInHub, hf_home):
    repo = hub.add_repo("org/tiny", FILES, gated_token="hf_flag_token_000")
    repo.revisions["v1"] = "cd" * 20
    args = _resolved(
        ["generate", "--model", "org/tiny", "--revision", "v1", "--hf-token", "hf_flag_token_000", "hi"]
    )
    assert Path(args.model).name == "cd" * 20
    assert {r.headers.get("authorization") for r in hub.gets()} == {"Bearer hf_flag_token_000"}
    hub.stop()
    args = _resolved(["bench", "engine", "--model", "org/tiny", "--revision", "v1", "--offline"])
    assert Path(args.model).name == "cd" * 20


def test_errors_are_one_line_with_a_non_zero_exit_and_no_traceback(hub: StandInHub, capsys):
    hub.add_repo("org/tiny-GGUF", {"Tiny-Q4_K_M.gguf": b"GGUF", "Tiny-Q8_0.gguf": b"GGUF"})
    cases = {
        ("serve", "nobody/missing"): "model nobody/missing not found on",
        ("generate", "--model", "org/tiny-GGUF:Q2_K", "hi"): "org/tiny-GGUF has no Q2_K GGUF; "
        "quants there: Q4_K_M, Q8_0",
        ("serve", "org/tiny-GGUF", "--offline"): "org/tiny-GGUF (revision 'main') is not in the hub cache",
    }
    for argv, message in cases.items():
        assert cli.main(list(argv)) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"sluiceway: error: {message}"), err
        assert err.count("\n") == 1 and "Traceback" not in err


def _save_tiny_model(directory: Path) -> None:
    """A tiny random Llama and a word-level tokenizer of its 256 tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from family_models import tiny

    tiny("llama").save_pretrained(directory)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, 256)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    tokenizer.save_pretrained(directory)


def test_a_model_fetched_by_its_id_generates_what_its_directory_generates(hub: StandInHub, tmp_path):
    """End to end through the offline `LLM`: fetched, loaded and run, as the same
    files given by path."""
    from sluiceway.engine.sampling_params import SamplingParams
    from sluiceway.offline import LLM

    local = tmp_path / "tiny"
    _save_tiny_model(local)
    files = {str(p.relative_to(local)): p.read_bytes() for p in local.iterdir()}
    hub.add_repo("org/tiny", {**files, "pytorch_model.bin": b"never fetched"})
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    outputs = []
    for model in ("org/tiny", str(local)):
        with LLM(model, dtype="float32", num_kv_blocks=16) as llm:
            outputs.append(llm.generate(["w5 w17 w99"], params)[0].outputs[0].token_ids)
    assert sorted(r.path.rpartition("/")[2] for r in hub.gets()) == sorted(files)
    assert outputs[0] == outputs[1] and len(outputs[0]) == 6


def test_a_remote_tensor_parallel_rank_fetches_the_hub_id_as_the_server_does(hub: StandInHub, hf_home, monkeypatch):
    from sluiceway.runner.tensor_parallel import remote

    repo = hub.add_repo("org/tiny", FILES)
    started = []
    monkeypatch.setattr(remote, "rank_spec", lambda model, engine, **kw: model)  # its ModelConfig
    monkeypatch.setattr(remote, "run_rank", lambda spec, rank, **kw: started.append((spec, rank)))
    environ = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}
    assert remote.main(["--model", "org/tiny", "-tp", "2"], environ) == 0
    [(model, rank)] = started
    assert rank == 1
    assert model.model == str(hf_home / "hub" / "models--org--tiny" / "snapshots" / repo.commit)
    with pytest.raises(SystemExit) as exited:
        remote.main(["--model", "nobody/missing", "-tp", "2"], environ)
    assert exited.value.code == 2


def test_a_split_gguf_fetched_by_its_quant_generates_what_the_whole_file_generates(hub: StandInHub, tmp_path):
    """`ORG/NAME-GGUF:QUANT` naming a split GGUF fetches every part and serves it
    through the GGUF loader, as the same model in one file."""
    import torch
    import transformers
    from gguf import GGMLQuantizationType

    from family_models import BASE
    from gguf_files import VOCAB_SIZE, write_gguf
    from sluiceway.engine.sampling_params import SamplingParams
    from sluiceway.offline import LLM

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**BASE, "vocab_size": VOCAB_SIZE}))
    (tmp_path / "parts").mkdir()
    [whole] = write_gguf(model, tmp_path / "Tiny-Q4_0.gguf", GGMLQuantizationType.Q4_0)
    parts = write_gguf(model, tmp_path / "parts" / "Tiny-Q4_0.gguf", GGMLQuantizationType.Q4_0, split_max_tensors=8)
    assert len(parts) > 1
    hub.add_repo(
        "org/Tiny-GGUF",
        {f"Q4_0/{p.name}": p.read_bytes() for p in parts} | {"Tiny-F32.gguf": b"GGUF never fetched"},
    )
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    outputs = []
    for name in ("org/Tiny-GGUF:q4_0", str(whole)):
        with LLM(name, dtype="float32", num_kv_blocks=16) as llm:
            outputs.append(llm.generate(["The capital of France is"], params)[0].outputs[0].token_ids)
    assert sorted(r.path.rpartition("/")[2] for r in hub.gets()) == [p.name for p in parts]
    assert outputs[0] == outputs[1] and len(outputs[0]) == 6
