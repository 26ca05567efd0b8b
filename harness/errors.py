"""The one error the local test servers raise (outside the router's ``RouterError`` tree)."""

from __future__ import annotations

__all__ = ["HarnessError"]


class HarnessError(Exception):
    """Raised when a local server cannot be built, started, reached or stopped."""
