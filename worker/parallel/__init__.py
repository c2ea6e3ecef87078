"""Parallelism: the layout's device meshes, and how the model is built and wrapped on them."""

from worker.parallel.parallel_dims import ParallelDims
from worker.parallel.parallelize import (
    TrainingModel,
    build_training_model,
    check_supported,
    parallelize_llama,
)

__all__ = [
    "ParallelDims",
    "TrainingModel",
    "build_training_model",
    "check_supported",
    "parallelize_llama",
]
