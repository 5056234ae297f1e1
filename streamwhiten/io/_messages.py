"""The words of the io layer's errors: one-line reasons from OS and storage-library failures, and the one
message every backend gives for a name a store does not hold.

Below every other module of ``io`` (the codecs, the stores and the backends all use it); it imports
nothing of ``io``.
"""

from __future__ import annotations

import re

from ..errors import BadInputError, StreamwhitenError

#: How to read past a hole, for the messages that refuse one.
FILL_HINT = " (pass fill_missing_chunks=True to read unwritten chunks as the fill value)"


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (its class name when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else exc.__class__.__name__


def io_error(exc: BaseException) -> str:
    """An OS or storage-library error as a short one-line reason, without a second copy of the path (of
    HDF5's long message, its ``error message = '...'`` part: "No space left on device")."""
    strerror = getattr(exc, "strerror", None)
    if strerror:
        return str(strerror)
    if isinstance(exc, StreamwhitenError):  # one of ours (a StoreIOError is an OSError): already names its store
        label, _, rest = first_line(exc).partition(": ")
        if rest and " " not in label and ("/" in label or "." in label):
            return rest
    failed = re.search(r"error message = '([^']*)'", str(exc))
    return failed.group(1) if failed else first_line(exc)


def name_not_found(
    label: str,
    asked: str | None,
    what: str,
    found: list[str],
    separator: str = ":/",
    option: bool = True,
    other: str = "",
    problem: str | None = None,
) -> BadInputError:
    """The one way every backend says that a name (``asked``; None: none given) is not in a store, or that
    one is needed: the ``what`` looked for, the names ``found``, and how to name one (``separator``; with
    ``option``, ``dataset=`` too); ``other``: more the store holds; ``problem``: what is wrong instead.

    ``in.h5: has no 2-D dataset /embeddings; its 2-D datasets: /emb (name it as in.h5:/emb, or with dataset='emb')``
    """
    shown = ", ".join(found[:10]) + (f" and {len(found) - 10} more" if len(found) > 10 else "")
    if asked is None:
        head = f"{label}: name the {what} to read" if found else f"{label}: holds no {what}"
    else:
        head = f"{label}: {problem or f'has no {what} {asked}'}"
    holds, how = (f"; it holds no {what}" if asked is not None else ""), ""
    if found:
        first = found[0].lstrip("/")
        holds = f"; its {what}s: {shown}"
        how = f" (name {'it' if len(found) == 1 else 'one'} as {label}{separator}{first}"
        how += f", or with dataset={first!r})" if option else ")"
    return BadInputError(f"{head}{holds}{other}{how}", param="dataset" if found and option else None)


__all__ = ["FILL_HINT", "first_line", "io_error", "name_not_found"]
