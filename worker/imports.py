"""Import a process's long-lived modules outside Python's cyclic garbage collector.

torch, with torch._dynamo (torch.optim imports it at the first optimizer) and the
distributed stack, leaves about 320,000 objects tracked by the collector, all of which live
as long as the process. With the collector on, every full collection walks them again: the
ones the import itself triggers, the ones while training, and the interpreter's final ones
at exit (about a second per rank on the dev cluster's CPUs). gc.freeze() moves everything
alive into a permanent generation that no collection visits; what the run allocates later
is collected as usual.

Measured on the dev cluster (2 cores), a process that imports worker.train and builds an
optimizer: 4.2 CPU-s from start to exit as before, 3.0 with this.
"""

from __future__ import annotations

import gc
import importlib


def import_long_lived(*modules: str) -> None:
    """Import `modules` with the collector paused, then freeze everything alive."""
    gc.disable()
    try:
        for name in modules:
            importlib.import_module(name)
    finally:
        gc.freeze()
        gc.enable()
