"""The unit tier's settings: every in-process service module sees these (set before any
caches them)."""

from __future__ import annotations

import os

# The site's one cluster is named here rather than read from whatever Slurm the machine
# running the tests has (service/slurm/cluster_info.py): the fake's name.
os.environ.setdefault("RUNYARD_CLUSTER_NAME", "default")
