"""Tensor parallelism: one model split over N rank processes (torch.distributed,
gloo on CPU, NCCL on CUDA), driven by the one engine loop through
`TensorParallelRunner`. See docs/tensor-parallel.md."""

from sluiceway.runner.tensor_parallel.driver import TensorParallelRunner
from sluiceway.runner.tensor_parallel.sharding import ShardPlan, TensorParallelError

__all__ = ["ShardPlan", "TensorParallelError", "TensorParallelRunner"]
