"""What runs on compute nodes: the training worker (torch is imported lazily by entry.py)."""
