"""Volumes: where files live, how their events arrive, and which files count (DESIGN §2).

    spec           VolumeSpec (stored form, include/exclude/recursion predicate)
    notifications  LocalNotification, SqsNotification, MnsNotification, PubSubNotification,
                   AzureQueueNotification
    backends       scheme → connector lister / reader / listener; normalize_location
    refresh        listing → file events (the diff a refresh commits)
    batching       group commit: gather, BatchLimits, CommitModel
    watcher        VolumeWatcher: receive → commit → ack
    registry       VolumeRegistry: create, drop, list, describe, refresh, watch
"""

from volume_stream.volumes.backends import (
    BACKENDS,
    OWN_OPTIONS,
    Backend,
    backend_for,
    normalize_location,
)
from volume_stream.volumes.notifications import (
    AzureQueueNotification,
    LocalNotification,
    MnsNotification,
    PubSubNotification,
    SqsNotification,
    notification_from_dict,
    notification_types,
)
from volume_stream.volumes.spec import SECRET_OPTION_KEYS, VolumeSpec

__all__ = [
    "BACKENDS",
    "OWN_OPTIONS",
    "SECRET_OPTION_KEYS",
    "AzureQueueNotification",
    "Backend",
    "LocalNotification",
    "MnsNotification",
    "PubSubNotification",
    "SqsNotification",
    "VolumeSpec",
    "backend_for",
    "normalize_location",
    "notification_from_dict",
    "notification_types",
]
