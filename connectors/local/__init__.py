"""Local directories as volumes: `LocalListener` (inotify, polling fallback), `LocalLister`,
`LocalReader`; see `connectors.local.listener` and `connectors.local.store`."""

from connectors.local.listener import LocalListener, _PendingFiles
from connectors.local.store import LocalLister, LocalReader, file_url, list_local

__all__ = ["LocalLister", "LocalListener", "LocalReader", "_PendingFiles", "file_url",
           "list_local"]
