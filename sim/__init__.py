"""A failure simulation of one long training run, decided by the service's own policy code.

Only Slurm (service/slurm/fake.py, behind the SlurmClient seam), time and the GPUs are
simulated; every decision is a call of the service's function (sim/policy.py). The service
never imports this package. `bench/goodput_sim.py` prints its figures.
"""
