"""Which Delta table features volume-stream's own readers and writers honour, and the refusal
of a table that another writer (a user's Spark: `ALTER TABLE ... SET TBLPROPERTIES`) gave one
they do not.

A directory table is read partly around delta-rs (its data files straight with pyarrow:
`_reads.local_rows`, `rewrite.load`) and written by our own commit writer, so a feature that
changes what a data file means is not honoured by them even where delta-rs would be: column
mapping would read the wrong columns. Deletion vectors are the exception: a directory table's
readers and writers apply them (`directory_table.dv`, DESIGN §4.8); SQL tables' do not.
Such a table is refused, naming the table and the features, before anything is read or
written (`check`); nothing guesses.

    check(dt, "/wh/volumes/v1/directory", write=True)   # raises UnsupportedFeature
"""

from __future__ import annotations

from deltalake import DeltaTable

__all__ = ["READABLE", "WRITABLE", "UnsupportedFeature", "check", "has_deletion_vectors",
           "unsupported", "writes_deletion_vectors"]

#: reader features our readers honour: none that change what a data file holds
READABLE = frozenset({"timestampNtz"})
#: writer features our commits honour: those implied by writer version 4 (our tables' own
#: protocol), whose table properties we check below, and timestamps without a time zone
WRITABLE = frozenset({"appendOnly", "invariants", "checkConstraints", "changeDataFeed",
                      "generatedColumns", "timestampNtz"})
#: features a directory table's readers and writers honour (DESIGN §4.8): deletion vectors,
#: and the variant type delta-rs lists with them when it creates such a table (no column has it)
_DV_FEATURES = frozenset({"deletionVectors", "variantType"})
#: the table property that turns deletion vectors on for writers
DV_KEY = "delta.enableDeletionVectors"
#: what to run in Spark to turn each common feature off again
_DROP_HINT = ("ALTER TABLE delta.`{path}` DROP FEATURE {feature} (after turning its property "
              "off), or recreate it")


class UnsupportedFeature(Exception):
    """The table uses Delta features volume-stream cannot honour (`features`, sorted)."""

    def __init__(self, path: str, features: list[str], *, write: bool):
        self.path, self.features, self.write = path, features, write
        verb = "write" if write else "read"
        super().__init__(
            f"the Delta table {path} uses table feature(s) {', '.join(features)}, which "
            f"volume-stream cannot {verb} (another writer turned them on, e.g. Spark's ALTER "
            f"TABLE ... SET TBLPROPERTIES); nothing was {'written' if write else 'read'}. "
            f"Turn them off in Spark: "
            + _DROP_HINT.format(path=path, feature=features[0]))


def has_deletion_vectors(dt: DeltaTable) -> bool:
    """Whether `dt`'s protocol has the deletion vectors feature (its files may carry DVs)."""
    return "deletionVectors" in (dt.protocol().reader_features or ())


def writes_deletion_vectors(dt: DeltaTable) -> bool:
    """Whether writers mark rows of `dt` in deletion vectors (merge-on-read, DESIGN §4.8)
    rather than rewriting their files: the feature, and its property on."""
    config = dt.metadata().configuration or {}
    return has_deletion_vectors(dt) and config.get(DV_KEY, "false").lower() == "true"


def unsupported(dt: DeltaTable, *, write: bool, deletion_vectors: bool = False) -> list[str]:
    """The features of `dt`'s protocol and properties that our readers (and, with `write`, our
    writers) cannot honour; empty when the table is fine. `deletion_vectors`: the caller reads
    and writes them (a directory table: DESIGN §4.8; SQL tables' readers do not)."""
    protocol = dt.protocol()
    config = dt.metadata().configuration or {}
    found: set[str] = set()
    reader_features = set(protocol.reader_features or ())
    found |= reader_features - READABLE - (_DV_FEATURES if deletion_vectors else set())
    if protocol.min_reader_version > 3:
        found.add(f"minReaderVersion {protocol.min_reader_version}")
    mapping = config.get("delta.columnMapping.mode", "none").lower()
    if mapping != "none":
        found.add("columnMapping")
    if write:
        writer_features = protocol.writer_features
        if writer_features is not None:
            found |= set(writer_features) - WRITABLE - (_DV_FEATURES if deletion_vectors
                                                         else set())
        elif protocol.min_writer_version == 6:  # legacy: identity columns
            found.add("identityColumns")
        if protocol.min_writer_version > 7:
            found.add(f"minWriterVersion {protocol.min_writer_version}")
        if config.get("delta.appendOnly", "false").lower() == "true":
            found.add("appendOnly (delta.appendOnly = true)")
        constraints = sorted(k for k in config if k.lower().startswith("delta.constraints."))
        if constraints:  # CHECK constraints, which our commits do not evaluate
            found.add(f"checkConstraints ({', '.join(constraints)})")
    return sorted(found)


def check(dt: DeltaTable, path: str, *, write: bool = False) -> None:
    """Raise `UnsupportedFeature` if `dt` (a directory table) uses a feature our readers (or
    writers) cannot honour."""
    features = unsupported(dt, write=write, deletion_vectors=True)
    if features:
        raise UnsupportedFeature(path, features, write=write)
