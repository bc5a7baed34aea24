"""The error hierarchy: each class says whether retrying the same call can help.

Expected outcomes of a write (flush timeout, disk full, ...) are not exceptions but the
`PutStatus` enum of the store; the classes here are for failures a caller must handle.
"""

from __future__ import annotations

from typing import ClassVar


class CapstanError(Exception):
    """Base of every error Capstan raises on purpose."""

    retriable: ClassVar[bool] = False


class ConfigError(CapstanError):
    """A settings file or value is wrong: an unknown key, a bad type, a value out of range."""


class StoreLockedError(CapstanError):
    """Another process holds the store's lock file; a second opener would corrupt the store."""

    retriable = True


class StoreCorruptError(CapstanError):
    """A file of the store cannot be read back and no intact copy remains."""


class StoreClosedError(CapstanError):
    """The store was used after `close()`."""
