"""Checkpoints the service can trust: CORRUPT ones and what follows from them."""
