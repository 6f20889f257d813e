"""Emit, training execution: how a training plan's emitted model takes a step, in one process.

``microbatch``: the batch cut into micro-batches (or shards) and a step of M micro-batches run
segment by segment in the plan's order; ``optimizer``: ``MasterWeights``, the plan's optimizer
in its precision (float32 masters under mixed precision). The training check (``check``),
``autoplace run --train`` and the data-parallel replicas (``distributed.ddp``) all step with
these, which is why they sit below both.
"""
