"""A mixture-of-experts MLP: the router picks `top_k` experts per token, and each
expert's SwiGLU runs over the tokens that picked it.

The dispatch is the simple one transformers uses, expert by expert in index
order with `index_add_`, so float32 results agree with it exactly; a grouped
or fused kernel would be a later optimisation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import torch
import torch.nn.functional as F

from sluiceway.runner.linear import Linear
from sluiceway.runner.models.architecture import ExpertsShape
from sluiceway.runner.models.weights import WeightView


def expert_views(
    shape: ExpertsShape, layer: int, prefix: str, state_dict: Mapping[str, Any]
) -> dict[str, WeightView]:
    """The router and every expert's gate, up and down, from transformers' layout:
    `{prefix}gate.weight [E, hidden]`, `{prefix}experts.gate_up_proj [E, 2I, hidden]`
    and `{prefix}experts.down_proj [E, hidden, I]`."""
    canon = f"layers.{layer}."
    views: dict[str, WeightView] = {}
    if prefix + "gate.weight" in state_dict:
        views[canon + "router"] = WeightView(prefix + "gate.weight")
    gate_up, down = prefix + "experts.gate_up_proj", prefix + "experts.down_proj"
    inter = shape.intermediate_size
    for e in range(shape.num_experts):
        if gate_up in state_dict:
            views[f"{canon}experts.{e}.gate"] = WeightView(gate_up, expert=e, rows=(0, inter))
            views[f"{canon}experts.{e}.up"] = WeightView(gate_up, expert=e, rows=(inter, 2 * inter))
        if down in state_dict:
            views[f"{canon}experts.{e}.down"] = WeightView(down, expert=e)
    return views


@attrs.frozen
class Expert:
    gate_up: Linear  # hidden -> 2 * intermediate
    down: Linear


@attrs.frozen
class Experts:
    """One layer's router and experts."""

    shape: ExpertsShape
    router: torch.Tensor  # [E, hidden]
    experts: Sequence[Expert]

    def __call__(self, x: torch.Tensor, silu_mul) -> torch.Tensor:
        """The mixture's output for the normalised rows `x [T, hidden]`: each row
        the weighted sum of its top-k experts' SwiGLU outputs."""
        s = self.shape
        probs = torch.softmax(F.linear(x, self.router), dim=-1, dtype=torch.float32)
        weights, chosen = torch.topk(probs, s.top_k, dim=-1)
        if s.normalize_top_k:
            weights /= weights.sum(dim=-1, keepdim=True)
        if not s.float32_weights:
            weights = weights.to(x.dtype)
        out = torch.zeros_like(x)
        # Which (row, slot) pairs chose each expert, for the experts chosen at all.
        hits = F.one_hot(chosen, num_classes=s.num_experts).permute(2, 1, 0)  # [E, k, T]
        for e in torch.nonzero(hits.sum(dim=(1, 2)) > 0).flatten().tolist():
            slot, rows = torch.where(hits[e])
            expert = self.experts[e]
            y = expert.down(silu_mul(expert.gate_up(x[rows])))
            out.index_add_(0, rows, (y * weights[rows, slot, None]).to(out.dtype))
        return out
