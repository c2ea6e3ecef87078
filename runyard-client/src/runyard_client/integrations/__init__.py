"""runyard inside the trainers most teams already use: one callback each.

    from runyard_client.integrations.hf import RunyardCallback         # transformers.Trainer
    from runyard_client.integrations.lightning import RunyardCallback  # Lightning

Either callback does for a framework's own loop what a hand-written script does with the
session (`runyard_client.connect()`): it reports each logged step (loss, learning rate,
tokens), commits each checkpoint once the framework has finished writing it, turns
`session.should_stop` (cancel, preemption, the end of a segment, Slurm's SIGUSR2) into the
framework's own save-then-stop, agreed by every rank, and hands the script the newest
committed checkpoint in the form the framework resumes from. Checkpoints go in the run's
checkpoint folder, which the callback names (`output_dir`, `dirpath`).

Each module imports its framework when it is imported; this package imports neither, and
`import runyard_client` never imports this package, so the client stays light for scripts
that use neither framework.
"""
