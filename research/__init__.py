"""Research baselines kept beside autoplace, not part of it: PipeDream's partitioner and a
replica planner, reproduced against the published profiles in ../shared/benchdata
(``benchmarks/pipedream.py``, ``benchmarks/results/pipedream.md``).

Code here imports autoplace and cost_models; neither ever imports it (tests/test_architecture.py
checks), and it is not shipped in the wheel (pyproject.toml packages ``autoplace*`` and
``cost_models*`` only).
"""
