"""Loading model files: both conventions, and every way a file can be wrong."""

from __future__ import annotations

import textwrap

import pytest
import torch

from autoplace.errors import ModelLoadError
from autoplace.trace.load import load_model_file


def _write(tmp_path, body: str):
    path = tmp_path / "m.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_build_function(tmp_path):
    path = _write(tmp_path, """
        import torch
        def build():
            return torch.nn.Linear(2, 2), (torch.randn(1, 2),)
    """)
    loaded = load_model_file(path)
    assert isinstance(loaded.model, torch.nn.Linear)
    assert loaded.args[0].shape == (1, 2) and loaded.kwargs == {} and loaded.name == "m"


def test_module_level_model_and_dict_inputs(tmp_path):
    path = _write(tmp_path, """
        import torch
        model = torch.nn.Linear(2, 2)
        example_inputs = {"input": torch.randn(1, 2)}
    """)
    loaded = load_model_file(path)
    assert loaded.args == () and set(loaded.kwargs) == {"input"}


@pytest.mark.parametrize("body, pattern", [
    ("x = 1\n", "defines neither build\\(\\) nor model/example_inputs"),
    ("def build():\n    return 3\n", "not a pair"),
    ("def build():\n    raise ValueError('boom')\n", "build\\(\\) raised ValueError.*line 2.*boom"),
    ("import nonexistent_pkg_xyz\n", "raised ModuleNotFoundError while being imported"),
    ("def build(:\n", "syntax error at line 1"),
    ("model = 3\nexample_inputs = ()\n", "not a torch.nn.Module"),
    ("import torch\nmodel = torch.nn.Linear(1, 1)\nexample_inputs = 5\n",
     "must be a tensor, a tuple of tensors, or a dict"),
])
def test_bad_files_say_what_is_wrong(tmp_path, body, pattern):
    with pytest.raises(ModelLoadError, match=pattern):
        load_model_file(_write(tmp_path, body))


def test_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model_file(tmp_path / "nope.py")
