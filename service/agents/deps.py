"""The classifier as a FastAPI dependency (built once from settings)."""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated

from fastapi import Depends

from service.config import get_settings
from service.recovery.classification import Classifier


@lru_cache
def get_classifier() -> Classifier:
    return Classifier.from_file(get_settings().classification_file)


async def classifier() -> Classifier:
    """async: FastAPI runs a plain function dependency in the thread pool, a trip per request."""
    return get_classifier()


ClassifierDep = Annotated[Classifier, Depends(classifier)]
