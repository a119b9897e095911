"""`vllm:lora_requests_info`: the adapters of the running and waiting sequences and
`max_lora`, as labels of one sample valued at the scrape's time; only where
adapters are served."""

from __future__ import annotations

import attrs
from engine_fakes import ByteTokenizer, ScriptedRunner, core_over

from sluiceway.api.observability.metrics import Metrics
from sluiceway.engine.sampling_params import SamplingParams

PROMPT = ByteTokenizer().encode("abcdef")


def test_the_core_reports_the_adapters_running_and_waiting():
    core = core_over(ScriptedRunner(num_blocks=64, block_size=4), max_num_seqs=2, budget=64)
    for request, lora_id in enumerate((2, 0, 1, 3)):
        core.add_request(request, PROMPT, SamplingParams(max_tokens=4, lora_id=lora_id))
    before = core.stats()
    assert (before.running_lora_ids, before.waiting_lora_ids) == ((), (1, 2, 3))
    core.step()  # two sequence slots: the first two requests run
    after = core.stats()
    assert (after.running_lora_ids, after.waiting_lora_ids) == ((2,), (1, 3))


def test_the_gauge_names_them_and_max_lora():
    stats = core_over(ScriptedRunner()).stats()
    served = attrs.evolve(
        stats, running_lora_adapters=("sql", "chat"), waiting_lora_adapters=("law",), max_lora=4
    )
    text = Metrics(lambda: served, "base").render().decode()
    [line] = [x for x in text.splitlines() if x.startswith("vllm:lora_requests_info{")]
    assert 'max_lora="4"' in line
    assert 'running_lora_adapters="sql,chat"' in line
    assert 'waiting_lora_adapters="law"' in line
    assert float(line.rsplit(" ", 1)[1]) > 1.7e9  # a Unix time, as vLLM's
    plain = Metrics(lambda: stats, "base").render().decode()
    assert "vllm:lora_requests_info" not in plain
