"""Streams: change records between two versions of a volume's directory table (DESIGN §5).

    changes   the pure semantics: STANDARD / APPEND_ONLY records, initial rows
    registry  StreamRegistry: create, drop, list, describe, records_between, offsets (CAS)
"""

from volume_stream.streams.changes import MODES, RECORD_SCHEMA

__all__ = ["MODES", "RECORD_SCHEMA"]
