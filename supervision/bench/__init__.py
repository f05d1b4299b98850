"""Load benchmarks that ship with the package (`harness bench parallel`).

Modules: `workload` (the shared workload), `simulator_process` (the
simulator in its own process), `harness_run` and `level_process` (one
level, in a child process), `parallel` (the driver), `report` (table, plot).
Child processes run them with `python -m`, so nothing is imported here.
"""
