"""The lab's device benchmarks: check, compare and time every backend on a CUDA GPU, in one call.

    python -m benchmarks --out DIR [--parts env,conformance,mma_hardware,bench,...]

Each experiment is a module of this package with a `run(ctx)` that returns a table (benchmarks.registry maps part
names to them); each part records its own failure instead of stopping the call, so one call yields everything it can.
Results go only to --out, never into the repository: a run is committed under data/<device>/<run_id>/ with its
env.json (device, driver, torch, Triton and peer versions, date, timing method) and listed in that device's RUNS.csv.

Importing the package or any of its modules needs no GPU: CUDA work happens only inside the functions.
"""
