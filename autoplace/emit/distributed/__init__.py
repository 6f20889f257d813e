"""Emit, distributed: what runs as several processes under torchrun.

``ddp`` (``OUT/train.py``: a training plan's data-parallel replicas, one process each, under
DistributedDataParallel or the plan's micro-batch step) and ``replicas`` (starting them, and
checking them against the original); ``ranks`` (``OUT/launch.py``: an inference plan as one
process per planned device) and ``stages`` (those ranks as ``torch.distributed.pipelining``
stages where they form a chain). docs/training.md and docs/multiprocess.md say more.
"""
