"""Following a run as it goes: the live view, its polling, and the ranks' logs."""
