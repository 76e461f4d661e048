"""The exceptions pieval raises.

Every error pieval reports says where: the file, the line (or record) and the field
when pieval knows them, as attributes. ``exit_code`` is the ``pieval`` command's for
the same error (1: what was checked failed; 2: the work could not be done).
"""

from __future__ import annotations

from typing import Optional

__all__ = [
    "PievalError",
    "InputError",
    "ConfigError",
    "PievalIOError",
    "UsageError",
    "NotFoundError",
    "QueryError",
    "EvidenceError",
]


class PievalError(Exception):
    """An error pieval reported."""

    def __init__(
        self,
        message: str,
        *,
        path: Optional[str] = None,
        line: Optional[int] = None,
        field: Optional[str] = None,
        exit_code: int = 2,
    ) -> None:
        super().__init__(message)
        self.message = message
        #: The file the problem is in, when there is one.
        self.path = path
        #: Its line (JSONL) or row (Parquet, a table), from 1.
        self.line = line
        #: The field, when the problem is one field's.
        self.field = field
        self.exit_code = exit_code


class InputError(PievalError, ValueError):
    """Input that breaks the contract: a bad line, a missing field, a wrong type."""


class ConfigError(PievalError, ValueError):
    """A configuration or data file that does not parse."""


class PievalIOError(PievalError, OSError):
    """A file that cannot be opened, read or written."""


class UsageError(PievalError, ValueError):
    """Arguments that do not go together."""


class NotFoundError(PievalError, LookupError):
    """Something named that does not exist: a run, a table, a model."""


class QueryError(PievalError, ValueError):
    """A query that cannot be planned or run."""


class EvidenceError(PievalError):
    """Keys, signatures and envelopes that are not what they claim."""
