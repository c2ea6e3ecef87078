"""The node health agent: one per compute node."""
