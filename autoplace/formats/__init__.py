"""The files autoplace reads and writes, each with its JSON Schema beside it.

Read in this order:

* ``plan``: ``Plan``, the pipeline's result as typed data, its ``plan.json`` form, and
  ``read_plan``, the one reader (checked by ``plan_check`` against ``plan.schema.json``).
* ``graph``: task-graph JSON (``autoplace solve``) to a ``Problem``, checked against
  ``graph.schema.json``.
* ``cluster``: cluster TOML files, checked against ``cluster.schema.json``.
* ``output``: writing an output directory, or a set of files, all at once or not at all.

Nothing is re-exported here: import from the module, so that reading a graph does not import
the plan's schema checks and the other way round.
"""
