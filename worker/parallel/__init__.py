"""Parallelism: the layout's device mesh, and how each model is wrapped on it."""

from worker.parallel.parallel_dims import ParallelDims
from worker.parallel.parallelize import check_supported, parallelize_llama

__all__ = ["ParallelDims", "check_supported", "parallelize_llama"]
