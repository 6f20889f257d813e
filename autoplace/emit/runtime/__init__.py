"""Emit, runtime: what runs a plan's schedule in one process.

``program`` is the schedule as data: per planned device the segments it runs and the handovers
it waits for and issues (``build_program``); ``check.replay`` plays one back against the
simulator, and ``codegen.threaded`` writes the forward that runs it.
"""
