"""Emit, files: an emitted model on disk, and the files it is read from or written as.

``saving``: ``save_model`` and ``load_model`` (``model.py``, ``weights.safetensors``,
``meta.json``, ``inputs.safetensors``); ``checkpoint``: the user's safetensors checkpoint, read
instead of a second copy of the weights; ``hf_device_map``: a module-granularity plan as a
Hugging Face ``device_map``.
"""
