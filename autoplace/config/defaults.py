"""The options' default values, in one place that imports nothing: the configuration
(``sections``) and the stages whose choices they are (``solve``, ``fold``) read them here."""

DEFAULT_TIME_LIMIT_S = 10.0  # the solver's limit for a plan, its what-if rows included
MODULE_TIME_LIMIT_S = 1.0  # ... at module granularity: a few hundred nodes, a tree of modules
DEFAULT_MAX_NODES = 120  # the largest traced graph CP-SAT solves whole before coarsening
# Splitting must beat the best single device by this fraction, or the plan is that device: the
# run-to-run noise of a measured forward pass (benchmarks/noise.py: the standard deviation of
# round medians was 2.8% to 7.6% for the MLP and 6.2% to 13% for GPT-2 on a 2-core machine). A
# smaller predicted gain could not be told apart by measuring, and one device needs no copies.
DEFAULT_MIN_GAIN = 0.05
