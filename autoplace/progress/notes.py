"""The notes a plan carries: what its reader should know beside its numbers (a device that was
simulated, a checkpoint's buffers, the replica counts weighed, ...), collected as the stages run.

``collecting()`` opens a collector (the pipeline opens one per plan); ``note(text)`` adds to the
innermost open one, from whichever stage is running, so no list is passed along or returned. A
nested collector keeps its notes to itself: ``pipeline.step`` plans each replica count inside
one and passes on only the chosen count's (``note_all``). Outside any collector a note is
dropped: a stage called on its own says nothing. Collectors follow ``contextvars``, so a thread
started inside one does not see it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["collecting", "note", "note_all"]

_OPEN: ContextVar[list[str] | None] = ContextVar("autoplace_notes", default=None)


@contextmanager
def collecting() -> Iterator[list[str]]:
    """A new collector, innermost until the block ends: the list of the notes made in it."""
    notes: list[str] = []
    token = _OPEN.set(notes)
    try:
        yield notes
    finally:
        _OPEN.reset(token)


def note(text: str | None, *, once: bool = False) -> None:
    """Add ``text`` to the innermost collector (nothing for ``None`` or an empty text; with
    ``once``, nothing if that collector holds it already)."""
    notes = _OPEN.get()
    if notes is None or not text or (once and text in notes):
        return
    notes.append(text)


def note_all(texts: Iterable[str]) -> None:
    """``note`` each of ``texts``, in order."""
    for text in texts:
        note(text)
