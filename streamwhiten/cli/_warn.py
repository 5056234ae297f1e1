"""Warnings on stderr: one line each, ``streamwhiten: warning: ...``, for what the library reports as data
(it never prints) and the command line knows how to fix."""

from __future__ import annotations

from typing import Any

import click


def warn(text: str) -> None:
    """``text`` as one warning line on stderr (the summary on stdout is unchanged, ``--json`` too)."""
    click.echo(f"streamwhiten: warning: {' '.join(text.split())}", err=True)


def warn_self_matches(matches: dict[str, Any] | None, excluded: bool) -> None:
    """Warn of queries that are corpus rows (``self_matches``) when no ``--exclude`` was given."""
    if excluded or not matches or not matches["count"]:
        return
    warn(
        f"{matches['count']:,} of {matches['n_queries']:,} queries equal a corpus row not judged relevant to "
        "them (cosine 1 within float rounding), which then comes first in their results and lowers every "
        "metric: give --exclude FILE, a TSV with the header query-id<TAB>corpus-id and one line per such "
        "pair (--json lists them under self_matches.pairs)"
    )


__all__ = ["warn", "warn_self_matches"]
