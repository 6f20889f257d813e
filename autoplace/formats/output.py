"""Writing output all at once or not at all.

``check_writable`` fails early, before any work, when an output directory cannot be written.
``atomic_output_dir`` fills a temporary directory beside the target and renames it into place
(``autoplace plan``/``solve``). ``replace_files`` puts a few files into an existing directory
together (``autoplace report``): every file is written first, and if moving any of them into
place fails, the ones already moved are put back, so the directory holds either all old files or
all new ones.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from autoplace.errors import OutputError

__all__ = ["atomic_output_dir", "check_writable", "replace_files"]


def check_writable(directory: str | os.PathLike[str]) -> Path:
    """Fail early, before any work, when ``directory`` cannot be created or written."""
    target = Path(directory).resolve()
    parent = target.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise OutputError(f"cannot create the output directory {str(target)!r}: {str(parent)!r} "
                          "is a file, not a directory; choose another --out")
    if target.exists() and not target.is_dir():
        raise OutputError(f"output path {str(target)!r} exists and is not a directory: choose "
                          "another --out")
    if not os.access(parent, os.W_OK | os.X_OK) or (
            target.exists() and not os.access(target.parent, os.W_OK)):
        raise OutputError(f"cannot write the output directory {str(target)!r}: {str(parent)!r} "
                          "is not writable; choose another --out")
    return target


def atomic_output_dir(directory: str | os.PathLike[str], write: Callable[[Path], None]) -> Path:
    """Run ``write(tmp)`` into a fresh temporary directory, then rename it to ``directory``
    (replacing an older one). On any failure nothing is left behind."""
    target = check_writable(directory)
    created = target.parent
    while not created.parent.exists():
        created = created.parent
    created = None if created.exists() else created  # the first parent this call creates
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        tmp.chmod(0o777 & ~_umask())  # mkdtemp makes it private; the output is an ordinary dir
    except OSError as exc:
        raise OutputError(f"cannot create the output directory {str(target)!r}: {exc}; choose "
                          "another --out") from exc
    try:
        write(tmp)
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            target.rename(old)
            tmp.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise
    return target


def replace_files(directory: str | os.PathLike[str], contents: Mapping[str, str]) -> list[Path]:
    """Write ``contents`` (file name -> text) into ``directory``, replacing the files there
    together: on any failure, Ctrl-C included, every file is as it was before the call.

    The new files are written into a staging directory inside ``directory`` (the same file
    system, so each move is one ``rename``); each old file is moved into the staging directory
    as it is replaced, and moved back if a later step fails.
    """
    target = Path(directory)
    staging = Path(tempfile.mkdtemp(prefix=".autoplace.tmp-", dir=target))
    moved: list[tuple[Path, Path | None]] = []  # (final path, where its old file went)
    try:
        mode = 0o666 & ~_umask()  # what an ordinary open() would have given the file
        for name, text in contents.items():
            (staging / name).write_text(text, encoding="utf-8")
            (staging / name).chmod(mode)
        for i, name in enumerate(contents):
            final = target / name
            backup = staging / f".old-{i}" if final.exists() else None
            if backup is not None:
                os.replace(final, backup)
            moved.append((final, backup))
            os.replace(staging / name, final)
    except BaseException:
        for final, backup in reversed(moved):
            if backup is not None:
                os.replace(backup, final)
            elif final.exists():
                final.unlink()
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [target / name for name in contents]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
