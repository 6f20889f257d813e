"""The public surface is explicit: adding or removing a name is a deliberate change."""

import autoplace


def test_exported_members():
    assert set(autoplace.__all__) == {
        "AutoplaceError", "Cluster", "Costs", "Device", "DeviceSpecError", "Edge", "EmitError",
        "GraphError", "InfeasibleError", "Link", "ModelLoadError", "OpGraph", "OpNode",
        "OutputError", "Placement", "Plan", "Problem", "Schedule", "TraceError",
        "VerificationError", "__version__", "plan", "plan_modules", "save", "simulate", "validate",
    }
    for name in autoplace.__all__:
        assert hasattr(autoplace, name), name


def test_errors_form_one_hierarchy():
    for name in autoplace.__all__:
        obj = getattr(autoplace, name)
        if isinstance(obj, type) and name.endswith("Error"):
            assert issubclass(obj, autoplace.AutoplaceError)
