"""The triton LoRA-delta kernel (`runner/kernels/lora_delta.py`) against a torch
reference: rows of several adapters of different ranks (padded with zeros to
the largest) and of the base model in one call, each row getting its own
adapter's delta and base rows none."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton", reason="triton is not importable; the LoRA kernel needs it")

from sluiceway.runner.kernels.lora_delta import lora_delta  # noqa: E402


def _stacks(gen, ranks, in_features, out_features, dtype, device):
    """A and B stacked by slot, each adapter's rank padded with zeros to the
    largest; the unpadded pairs too."""
    rank = max(ranks)
    a = torch.zeros(len(ranks), rank, in_features, dtype=dtype, device=device)
    b = torch.zeros(len(ranks), out_features, rank, dtype=dtype, device=device)
    pairs = []
    for s, r in enumerate(ranks):
        pa = torch.randn(r, in_features, generator=gen).to(dtype) * 0.2
        pb = torch.randn(out_features, r, generator=gen).to(dtype) * 0.2
        a[s, :r], b[s, :, :r] = pa, pb
        pairs.append((pa, pb))
    return a, b, pairs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("in_features", "out_features", "ranks"),
    [(96, 80, [8, 16, 4]), (64, 130, [16]), (200, 64, [2, 32])],
)
def test_each_row_gets_its_own_adapters_delta(dtype, in_features, out_features, ranks, device):
    gen = torch.Generator().manual_seed(in_features + out_features)
    a, b, pairs = _stacks(gen, ranks, in_features, out_features, dtype, device)
    rows = 11
    slots = torch.tensor([(t % (len(ranks) + 1)) - 1 for t in range(rows)], dtype=torch.int32)
    x = torch.randn(rows, in_features, generator=gen).to(dtype).to(device)
    y = torch.randn(rows, out_features, generator=gen).to(dtype).to(device)
    want = y.float().clone()
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            pa, pb = pairs[s]
            want[t] += pb.float() @ (pa.float() @ x[t].float().cpu()).to(device)
    got = lora_delta(y, x, a, b, slots.to(device))
    assert got is y
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want, rtol=tolerance, atol=tolerance)
    base = slots < 0
    assert torch.equal(got[base.to(device)].float(), want[base.to(device)])  # untouched


def test_shapes_that_do_not_fit_are_refused(device):
    x = torch.zeros(2, 8, device=device)
    y = torch.zeros(2, 4, device=device)
    a = torch.zeros(1, 2, 8, device=device)
    with pytest.raises(ValueError, match="do not fit together"):
        lora_delta(y, x, a, torch.zeros(1, 5, 2, device=device), torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"slots \(3,\) is not \[2\]"):
        lora_delta(y, x, a, torch.zeros(1, 4, 2, device=device), torch.zeros(3, dtype=torch.int32))
