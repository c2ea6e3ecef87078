"""`runyard data prepare`: tokenize a corpus into the worker's token shards.

Imports neither torch nor the service: it runs on any machine with the tokenizer folder,
in parallel over its cores, and resumes after an interrupt (see prepare.py).
"""

from .errors import PrepareError
from .prepare import PrepareProgress, PrepareSettings, prepare_dataset

__all__ = ["PrepareError", "PrepareProgress", "PrepareSettings", "prepare_dataset"]
