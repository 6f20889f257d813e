"""PipeDream (Narayanan et al., SOSP 2019) on its own per-layer training profiles, and
autoplace's solver with data-parallel replicas against it, both scored by PipeDream's cost model.

Read in this order:

* ``profiles``: the reader of PipeDream's ``graph.txt`` profiles.
* ``partitioner``: PipeDream's dynamic program over pipeline stages with replication, and the
  data-parallel and one-device plans it is measured against.
* ``step_graph``: a profile as the graph of one training step, an ``autoplace.ir.Problem``.
* ``replicas``: the rule that times a plan of replicated groups (PipeDream's cost model for any
  grouping) and the planner that solves each shape with ``autoplace.solve.solve``.

Nothing is re-exported here: import from the module.
"""
