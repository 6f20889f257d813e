"""Emit, runtime: what runs a plan's schedule in one process.

``program`` is the schedule as data: per planned device the segments it runs and the handovers
it waits for and issues (``build_program``); ``check.replay`` plays one back against the
simulator, and ``codegen.threaded`` writes the forward that runs it as ``engine`` steps.
``engine`` is the code every generated ``model.py`` runs (the threaded runtime and the helpers
its classes use); it imports only torch and the standard library, as ``save_model`` copies it
next to ``model.py`` (``_runtime.py``) for a saved model to load without autoplace.
"""
