"""The directory table's own errors (converted to `VolumeStreamError`s by `volume_stream`)."""

__all__ = ["CommitConflict", "TableMissing"]


class TableMissing(FileNotFoundError):
    """No directory table at the given path."""


class CommitConflict(RuntimeError):
    """Another writer kept winning the race for the next version."""
