"""Emit, code generation: the placed graph cut into device segments, and the model that runs them.

Read in the order ``model.emit_model`` calls them: ``lower`` (the graph segments are cut from),
``segment`` (which ops form which segment, in which order), ``fxgraph`` (each segment as a
``GraphModule``), ``source`` (the Python source of the forward and of ``model.py``, importing
only torch, the standard library and ``runtime.engine``) and ``threaded`` (the forward that runs
the plan's schedule over several devices, ``runtime.program.Program``); then ``model`` itself.
"""
