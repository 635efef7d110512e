"""The Python UDFs registered for SQL, per SparkSession (UDFs are session-wide)."""

from __future__ import annotations

import weakref
from typing import Any

__all__ = ["PENDING", "UDFS", "registered_udfs"]

#: Python UDFs registered through `sql.register_udf`: {session: {lower-case name: name}}
UDFS: weakref.WeakKeyDictionary[Any, dict[str, str]] = weakref.WeakKeyDictionary()

#: UDFs waiting for the catalog's Spark session: {catalog: [(name, fn, return_type)]}
PENDING: weakref.WeakKeyDictionary[Any, list[tuple[str, Any, Any]]] = \
    weakref.WeakKeyDictionary()


def registered_udfs(spark: Any) -> list[str]:
    """Names of the Python UDFs registered through `register_udf` in this session."""
    return sorted(UDFS.get(spark, {}).values())
