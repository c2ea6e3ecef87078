"""Experiment trackers (MLflow, W&B, TensorBoard): each run's steps, events and summary
exported once each, across restarts, by one exporter per tracker kind."""
