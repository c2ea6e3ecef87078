"""Work beside training that must not take a CPU core from it when cores are short.

A checkpoint's files are serialised, written and checksummed beside training. Where the
host has cores to spare that costs training nothing; where it has not (this dev machine's
two cores; a GPU node whose cores also run data loading for eight ranks), the scheduler
shares a core between that work and training equally, and training slows by as much as the
work takes. At the lowest priority the work runs only on what training leaves over.

Only for a process of its own: Linux gives a nice value to one thread, and a low-priority
thread of training's own process that is descheduled while it holds the GIL stops training
until it runs again (measured: a hidden save cost 1.46 s instead of 0.02 s, see
docs/design.md).
"""

from __future__ import annotations

import os
import threading

BACKGROUND_NICE = 19  # the lowest priority: runs on what the other threads leave


def lower_priority() -> None:
    """Lower the calling thread's CPU priority to BACKGROUND_NICE (once: an unprivileged
    thread cannot raise it again); a no-op where the platform has no setpriority."""
    if not hasattr(os, "setpriority"):
        return
    thread_id = threading.get_native_id()
    try:
        if os.getpriority(os.PRIO_PROCESS, thread_id) < BACKGROUND_NICE:
            os.setpriority(os.PRIO_PROCESS, thread_id, BACKGROUND_NICE)
    except OSError:  # a sandbox that refuses it: the work keeps its priority
        pass
