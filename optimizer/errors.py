"""One exception type for every user-facing failure, so the CLI prints one line and exits non-zero."""
from __future__ import annotations


class EpifuseError(Exception):
    """A clear, one-line error naming the file, node and value at fault."""

    def __init__(self, message: str, *, path: str | None = None, node: str | None = None):
        parts = [p for p in (path, f"node '{node}'" if node else None) if p]
        super().__init__(f"{': '.join(parts)}: {message}" if parts else message)
