"""The profile cache: reuse, two processes writing at once, a corrupt file rebuilt, measurements
from another torch version reported and not used, and a fit stored and read back."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

from autoplace.profile.cache import LinkRecord, OpRecord, ProfileCache, default_cache_path
from cost_models.calibration import CalibrationFit


def record(i: int, *, median_s: float = 1e-3, device_key: str = "cpu:test:1t") -> OpRecord:
    return OpRecord(signature=f'["aten.relu.default",[["T",[{i}],"float32"]],{{}}]',
                    device_key=device_key, device_type="CPU", family="elementwise",
                    dtype="float32", flops=0.0, bytes_accessed=8.0 * i, launches=1,
                    median_s=median_s, spread=0.01, samples=5, param_bytes=0,
                    output_bytes=4 * i, workspace_bytes=None)


def test_a_measurement_is_reused_by_signature_device_and_torch_version(tmp_path):
    path = tmp_path / "profile.sqlite3"
    with ProfileCache(path, torch_version="2.13.0") as cache:
        cache.put_ops([record(1, median_s=2e-3)])
        assert cache.notes == []
    with ProfileCache(path, torch_version="2.13.0") as cache:
        assert cache.get_op(record(1).signature, "cpu:test:1t").median_s == 2e-3
        assert cache.get_op(record(1).signature, "cpu:other:1t") is None
        assert cache.get_op(record(2).signature, "cpu:test:1t") is None
        assert [r.signature for r in cache.ops_for("CPU")] == [record(1).signature]


def test_measurements_from_another_torch_version_are_reported_and_not_used(tmp_path):
    path = tmp_path / "profile.sqlite3"
    with ProfileCache(path, torch_version="2.12.0") as cache:
        cache.put_ops([record(1), record(2)])
    with ProfileCache(path, torch_version="2.13.0") as cache:
        assert cache.get_op(record(1).signature, "cpu:test:1t") is None
        assert cache.ops_for("CPU") == []
        (note,) = cache.notes
        assert "2 made with torch 2.12.0" in note and "not used" in note


def test_a_corrupt_file_is_moved_aside_and_rebuilt(tmp_path):
    path = tmp_path / "profile.sqlite3"
    path.write_bytes(b"this is not a database" * 100)
    with ProfileCache(path, torch_version="2.13.0") as cache:
        (note,) = cache.notes
        assert "not a readable database" in note and "started a new one" in note
        cache.put_ops([record(3)])
        assert cache.get_op(record(3).signature, "cpu:test:1t") is not None
    assert list(tmp_path.glob("profile.sqlite3.corrupt-*"))
    with ProfileCache(path, torch_version="2.13.0") as cache:
        assert cache.notes == [] and cache.get_op(record(3).signature, "cpu:test:1t")


def test_an_unwritable_location_falls_back_to_memory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with ProfileCache(blocker / "sub" / "profile.sqlite3", torch_version="2.13.0") as cache:
        assert "kept in memory only" in cache.notes[0]
        cache.put_ops([record(4)])
        assert cache.get_op(record(4).signature, "cpu:test:1t") is not None


def test_no_cache_keeps_nothing():
    with ProfileCache(None, torch_version="2.13.0") as cache:
        cache.put_ops([record(1)])
        assert cache.describe()["path"] is None and cache.describe()["ops"] == 1


# The writer loads cache.py alone (it needs no torch), so the two processes start in well under a
# second instead of importing torch first, and their writes overlap.
_WRITER = textwrap.dedent("""
    import importlib.util, sys
    spec = importlib.util.spec_from_file_location("cache", {module!r})
    cache_module = importlib.util.module_from_spec(spec)
    sys.modules["cache"] = cache_module
    spec.loader.exec_module(cache_module)
    cache = cache_module.ProfileCache({path!r}, torch_version="2.13.0")
    for i in range({start}, {start} + 200):
        record = cache_module.OpRecord(
            signature=f'["aten.relu.default",[["T",[{{i}}],"float32"]],{{{{}}}}]',
            device_key="cpu:test:1t", device_type="CPU", family="elementwise",
            dtype="float32", flops=0.0, bytes_accessed=8.0 * i, launches=1, median_s=1e-3,
            spread=0.01, samples=5, param_bytes=0, output_bytes=4 * i, workspace_bytes=None)
        cache.put_ops([record])
        assert cache.get_op(record.signature, "cpu:test:1t") is not None
    assert not cache.notes, cache.notes
    print("ok")
""")


def test_two_processes_profiling_at_once_both_keep_their_measurements(tmp_path):
    path = tmp_path / "profile.sqlite3"
    module = str(Path(__file__).resolve().parents[1] / "autoplace" / "profile" / "cache.py")
    procs = [subprocess.Popen([sys.executable, "-c",
                               _WRITER.format(module=module, path=str(path), start=start)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for start in (0, 100)]  # overlapping keys: both write rows 100..199
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and out.strip() == "ok", err
    with ProfileCache(path, torch_version="2.13.0") as cache:
        assert len(cache.ops_for("CPU")) == 300 and cache.notes == []
        assert cache.get_op(record(150).signature, "cpu:test:1t") == record(150, median_s=1e-3)


def test_links_and_fits_round_trip(tmp_path):
    path = tmp_path / "profile.sqlite3"
    fit = CalibrationFit(device_type="CPU", laws={"matmul": (1e-6, 2.0, 9.0)},
                         pooled=(0.0, 1.0, 1.0), samples=10, relative_error=0.1)
    link = LinkRecord(src_key="a", dst_key="b", latency_s=1e-5, bandwidth_bytes_per_s=1e10,
                      points=((4096, 1.4e-5), (65536, 1.6e-5)))
    with ProfileCache(path, torch_version="2.13.0") as cache:
        cache.put_fit(fit)
        cache.put_link(link)
    with ProfileCache(path, torch_version="2.13.0") as cache:
        assert cache.get_fits() == {"CPU": fit}
        assert cache.get_link("a", "b") == link
    with ProfileCache(path, torch_version="2.14.0") as cache:
        assert cache.get_fits() == {} and cache.get_link("a", "b") is None


def test_default_location_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOPLACE_CACHE_DIR", str(tmp_path))
    assert default_cache_path() == tmp_path / "profile.sqlite3"
    monkeypatch.delenv("AUTOPLACE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_path() == tmp_path / "xdg" / "autoplace" / "profile.sqlite3"


def _cache_of_schema(path: Path, schema: str) -> None:
    with ProfileCache(path, torch_version="2.13.0") as cache:
        cache.put_ops([record(1)])
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (schema,))
    conn.close()


def test_a_cache_of_an_older_schema_is_set_aside_with_a_note(tmp_path):
    path = tmp_path / "profile.sqlite3"
    _cache_of_schema(path, "1")
    with ProfileCache(path, torch_version="2.13.0") as cache:
        (note,) = cache.notes
        assert "older autoplace" in note and "cache schema 1" in note
        assert "started a new one" in note
        assert cache.get_op(record(1).signature, "cpu:test:1t") is None
    assert len(list(tmp_path.glob("profile.sqlite3.corrupt-*"))) == 1


def test_a_cache_of_a_newer_schema_is_left_alone_and_the_run_keeps_to_memory(tmp_path):
    path = tmp_path / "profile.sqlite3"
    _cache_of_schema(path, "99")
    with ProfileCache(path, torch_version="2.13.0") as cache:
        (note,) = cache.notes
        assert "newer autoplace" in note and "left as it is" in note
        assert cache.describe()["path"] is None
    assert not list(tmp_path.glob("profile.sqlite3.corrupt-*"))
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() == ("99",)
    conn.close()
