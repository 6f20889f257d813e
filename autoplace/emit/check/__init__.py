"""Emit, checks: an emitted model held against the original model and against its plan.

Read ``outputs`` (``verify``: ``torch.testing.assert_close`` on the outputs; ``check_peak``),
``memory`` (the peak bytes per planned device, measured as the model runs, or as a training
step runs), ``replay`` (the runtime's program played under the plan's costs, against the
simulator) and ``training`` (``verify_training``: a few optimizer steps beside the original).
"""
