"""Metrics, structured logs and request tracing for operators."""
