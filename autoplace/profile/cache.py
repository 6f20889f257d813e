"""The profile cache: measured op times, links and calibration fits in one SQLite file.

Where: ``$AUTOPLACE_CACHE_DIR/profile.sqlite3`` when that variable is set, else
``$XDG_CACHE_HOME/autoplace/profile.sqlite3``, else ``~/.cache/autoplace/profile.sqlite3``
(``default_cache_path``). ``--no-cache`` uses a private in-memory database instead.

An op's time is keyed by its signature (target, input shapes and dtypes, other arguments), its
device (``autoplace.cluster.device_key``: the GPU's name, or the CPU's model and thread count) and
the torch version; a model's whole forward pass by all its ops' signatures, and in that table
too the replicas' gradient averaging (``profile.allreduce``, keyed ``allreduce:...``). Another
torch version's rows are never used, only counted. Two processes may profile at once (WAL mode,
a busy timeout, opening retried, one short transaction per write, rows replaced whole). An
unreadable file, or an older schema, is moved aside and rebuilt; a newer schema is left alone
and the run keeps its measurements in memory, as after any later database error; each with a
note. The cache never fails a plan. For users: ``docs/profiling.md``, "The profile cache".
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cost_models.calibration import CalibrationFit

__all__ = ["CACHE_ENV", "SCHEMA", "LinkRecord", "OpRecord", "ProfileCache", "default_cache_path"]

CACHE_ENV = "AUTOPLACE_CACHE_DIR"
SCHEMA = 2  # 2: ops carry pooling windows as FLOPs and the pooling family
_BUSY_TIMEOUT_S = 30.0

_TABLES = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS ops (
    signature TEXT NOT NULL, device_key TEXT NOT NULL, torch_version TEXT NOT NULL,
    device_type TEXT NOT NULL, family TEXT NOT NULL, dtype TEXT NOT NULL,
    flops REAL NOT NULL, bytes_accessed REAL NOT NULL, launches INTEGER NOT NULL,
    median_s REAL NOT NULL, spread REAL NOT NULL, samples INTEGER NOT NULL,
    param_bytes INTEGER NOT NULL, output_bytes INTEGER NOT NULL, workspace_bytes INTEGER,
    method TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (signature, device_key, torch_version));
CREATE TABLE IF NOT EXISTS links (
    src_key TEXT NOT NULL, dst_key TEXT NOT NULL, torch_version TEXT NOT NULL,
    latency_s REAL NOT NULL, bandwidth_bytes_per_s REAL NOT NULL, points TEXT NOT NULL,
    created REAL NOT NULL, PRIMARY KEY (src_key, dst_key, torch_version));
CREATE TABLE IF NOT EXISTS forwards (
    model_key TEXT NOT NULL, device_key TEXT NOT NULL, torch_version TEXT NOT NULL,
    median_s REAL NOT NULL, spread REAL NOT NULL, samples INTEGER NOT NULL,
    created REAL NOT NULL, PRIMARY KEY (model_key, device_key, torch_version));
CREATE TABLE IF NOT EXISTS fits (
    device_type TEXT NOT NULL, torch_version TEXT NOT NULL, fit TEXT NOT NULL,
    created REAL NOT NULL, PRIMARY KEY (device_type, torch_version));
"""


def default_cache_path() -> Path:
    """Where the cache lives unless told otherwise (see the module docstring)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]) / "profile.sqlite3"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "autoplace" / "profile.sqlite3"


@dataclass(frozen=True, kw_only=True)
class OpRecord:
    """One op measured on one device: enough to reuse the time and to calibrate with it.
    ``method`` is ``in-situ`` (timed where it runs in the model: the CPU), ``isolated`` (alone:
    GPUs), or ``with-neighbour`` when the op had to be timed together with the op before it.
    ``workspace_bytes`` is None where the allocator keeps no peak statistics (the CPU)."""

    signature: str
    device_key: str
    device_type: str
    family: str
    dtype: str
    flops: float
    bytes_accessed: float
    launches: int
    median_s: float
    spread: float
    samples: int
    param_bytes: int
    output_bytes: int
    workspace_bytes: int | None
    method: str = "isolated"


@dataclass(frozen=True, kw_only=True)
class LinkRecord:
    """A fitted link between two device keys; ``points`` are (bytes, seconds) measured."""

    src_key: str
    dst_key: str
    latency_s: float
    bandwidth_bytes_per_s: float
    points: tuple[tuple[int, float], ...]


class ProfileCache:
    """The cache at ``path`` (``None``: in memory, nothing kept) for ``torch_version``.

    ``notes`` collects what the user should hear about: a corrupt file rebuilt, measurements
    from another torch version ignored, a location that cannot be written.
    """

    def __init__(self, path: str | os.PathLike[str] | None, *, torch_version: str) -> None:
        self.torch_version = torch_version
        self.notes: list[str] = []
        self.path = Path(path) if path is not None else None
        self._conn = self._open()
        self._report_other_versions()

    # ---- opening

    def _open(self) -> sqlite3.Connection:
        if self.path is None:
            return self._connect(":memory:")
        inode = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            inode = _inode(self.path)
            return self._connect_waiting(str(self.path))
        except _SchemaError as exc:
            if exc.newer:
                return self._fallback(f"the profile cache {self.path} was made by a newer "
                                      f"autoplace ({exc}); it is left as it is")
            return self._rebuild(exc, inode, "was made by an older autoplace")
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
                return self._fallback(f"the profile cache {self.path} stayed locked ({exc})")
            return self._rebuild(exc, inode, "was not a readable database")
        except OSError as exc:
            return self._fallback(f"the profile cache {self.path} cannot be written ({exc})")

    def _connect_waiting(self, where: str) -> sqlite3.Connection:
        """``_connect``, retried while another process holds the file: switching a new file to
        WAL mode and recovering another process's WAL answer "locked" at once, without the busy
        handler, so the busy timeout alone does not cover two processes opening together."""
        deadline = time.monotonic() + _BUSY_TIMEOUT_S
        pause = 0.01
        while True:
            try:
                return self._connect(where)
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.5)

    def _connect(self, where: str) -> sqlite3.Connection:
        conn = sqlite3.connect(where, timeout=_BUSY_TIMEOUT_S, isolation_level=None)
        try:
            check = conn.execute("PRAGMA quick_check").fetchone()
            if check is None or check[0] != "ok":
                raise sqlite3.DatabaseError(f"integrity check says {check and check[0]!r}")
            if where != ":memory:":
                conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(f"BEGIN IMMEDIATE;{_TABLES}COMMIT;")
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
            if row is None:
                conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA),))
            elif row[0] != str(SCHEMA):
                raise _SchemaError(row[0])
        except BaseException:
            conn.close()
            raise
        return conn

    def _rebuild(self, exc: Exception, inode: int | None, why: str) -> sqlite3.Connection:
        """Move the file that failed (``inode``) aside and start a new one. When another
        process got there first, the file at the path is already a new one: use it."""
        assert self.path is not None
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        try:
            if inode is not None and _inode(self.path) == inode:
                self.path.rename(aside)
                for suffix in ("-wal", "-shm"):
                    Path(f"{self.path}{suffix}").unlink(missing_ok=True)
                where = f"moved it to {aside.name} and started a new one"
            else:
                where = "another process has started a new one"
            conn = self._connect_waiting(str(self.path))
        except (OSError, sqlite3.DatabaseError) as again:
            return self._fallback(f"the profile cache {self.path} is unreadable ({exc}) and "
                                  f"could not be rebuilt ({again})")
        self.notes.append(f"the profile cache {self.path} {why} ({exc}); {where}: ops are "
                          "profiled again")
        return conn

    def _fallback(self, why: str) -> sqlite3.Connection:
        self.notes.append(f"{why}; measurements of this run are kept in memory only")
        self.path = None
        return self._connect(":memory:")

    def _guard(self, what: str, fn, default):  # noqa: ANN001, ANN202 - internal helper
        """Run a database call; on a database error, note it once and go on in memory."""
        try:
            return fn()
        except sqlite3.DatabaseError as exc:
            if self.path is None:
                raise
            self._conn.close()
            self._conn = self._fallback(f"the profile cache {self.path} failed while {what} "
                                        f"({exc})")
            return default

    def _report_other_versions(self) -> None:
        rows = self._guard("reading", lambda: self._conn.execute(
            "SELECT torch_version, COUNT(*) FROM ops WHERE torch_version != ? "
            "GROUP BY torch_version", (self.torch_version,)).fetchall(), [])
        if rows:
            versions = ", ".join(f"{n} made with torch {v}" for v, n in sorted(rows))
            self.notes.append(f"the profile cache holds measurements from another torch version "
                              f"({versions}); torch {self.torch_version} is running, so they are "
                              "not used (kernels change between releases) and ops are profiled "
                              "again")

    # ---- ops

    def get_op(self, signature: str, device_key: str) -> OpRecord | None:
        row = self._guard("reading", lambda: self._conn.execute(
            f"SELECT {_OP_COLUMNS} FROM ops WHERE signature = ? AND device_key = ? "
            "AND torch_version = ?", (signature, device_key, self.torch_version)).fetchone(), None)
        return None if row is None else OpRecord(**dict(zip(_OP_FIELDS, row)))

    def put_ops(self, records: Iterable[OpRecord]) -> None:
        rows = [(*(getattr(r, f) for f in _OP_FIELDS), self.torch_version, time.time())
                for r in records]
        if not rows:
            return

        def write() -> None:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.executemany(
                    f"INSERT OR REPLACE INTO ops ({_OP_COLUMNS}, torch_version, created) "
                    f"VALUES ({', '.join('?' * (len(_OP_FIELDS) + 2))})", rows)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

        if self._guard("writing", write, False) is False:
            write()  # now in memory

    def ops_for(self, device_type: str) -> list[OpRecord]:
        """Every op measured on devices of ``device_type`` with this torch version."""
        rows = self._guard("reading", lambda: self._conn.execute(
            f"SELECT {_OP_COLUMNS} FROM ops WHERE device_type = ? AND torch_version = ? "
            "ORDER BY signature, device_key", (device_type, self.torch_version)).fetchall(), [])
        return [OpRecord(**dict(zip(_OP_FIELDS, row))) for row in rows]

    # ---- links

    def get_link(self, src_key: str, dst_key: str) -> LinkRecord | None:
        row = self._guard("reading", lambda: self._conn.execute(
            "SELECT latency_s, bandwidth_bytes_per_s, points FROM links WHERE src_key = ? AND "
            "dst_key = ? AND torch_version = ?", (src_key, dst_key, self.torch_version)
        ).fetchone(), None)
        if row is None:
            return None
        return LinkRecord(src_key=src_key, dst_key=dst_key, latency_s=row[0],
                          bandwidth_bytes_per_s=row[1],
                          points=tuple(tuple(p) for p in json.loads(row[2])))

    def put_link(self, record: LinkRecord) -> None:
        def write() -> None:
            self._conn.execute(
                "INSERT OR REPLACE INTO links VALUES (?, ?, ?, ?, ?, ?, ?)",
                (record.src_key, record.dst_key, self.torch_version, record.latency_s,
                 record.bandwidth_bytes_per_s, json.dumps(record.points), time.time()))

        if self._guard("writing", write, False) is False:
            write()

    # ---- whole forward passes

    def get_forward(self, model_key: str, device_key: str) -> tuple[float, float, int] | None:
        """``(median_s, spread, samples)`` of a whole forward pass measured before."""
        return self._guard("reading", lambda: self._conn.execute(
            "SELECT median_s, spread, samples FROM forwards WHERE model_key = ? AND "
            "device_key = ? AND torch_version = ?",
            (model_key, device_key, self.torch_version)).fetchone(), None)

    def put_forward(self, model_key: str, device_key: str, *, median_s: float, spread: float,
                    samples: int) -> None:
        def write() -> None:
            self._conn.execute("INSERT OR REPLACE INTO forwards VALUES (?, ?, ?, ?, ?, ?, ?)",
                               (model_key, device_key, self.torch_version, median_s, spread,
                                samples, time.time()))

        if self._guard("writing", write, False) is False:
            write()

    # ---- calibration fits

    def get_fits(self) -> dict[str, CalibrationFit]:
        rows = self._guard("reading", lambda: self._conn.execute(
            "SELECT device_type, fit FROM fits WHERE torch_version = ?",
            (self.torch_version,)).fetchall(), [])
        fits = {}
        for device_type, text in rows:
            try:
                fits[device_type] = CalibrationFit.from_dict(json.loads(text))
            except (ValueError, KeyError, TypeError):
                continue  # a fit this version cannot read is refitted from the ops
        return fits

    def put_fit(self, fit: CalibrationFit) -> None:
        def write() -> None:
            self._conn.execute("INSERT OR REPLACE INTO fits VALUES (?, ?, ?, ?)",
                               (fit.device_type, self.torch_version, fit.to_json(), time.time()))

        if self._guard("writing", write, False) is False:
            write()

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> ProfileCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def describe(self) -> Mapping[str, object]:
        """Where the cache is and what it holds, for messages and the plan file."""
        count = self._guard("reading", lambda: self._conn.execute(
            "SELECT COUNT(*) FROM ops WHERE torch_version = ?",
            (self.torch_version,)).fetchone()[0], 0)
        return {"path": str(self.path) if self.path else None, "ops": count,
                "torch_version": self.torch_version}


class _SchemaError(sqlite3.DatabaseError):
    """The file is a cache of another schema (``found``); ``newer`` when a later autoplace
    wrote it."""

    def __init__(self, found: str) -> None:
        super().__init__(f"cache schema {found}, this autoplace reads {SCHEMA}")
        self.newer = not found.isdigit() or int(found) > SCHEMA


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except OSError:
        return None


_OP_FIELDS = tuple(f for f in OpRecord.__dataclass_fields__)
_OP_COLUMNS = ", ".join(_OP_FIELDS)
