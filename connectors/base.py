"""Old home of the connector contracts; they live in `connectors.protocols` now."""

from connectors.protocols import LISTING_SCHEMA, Listener, Lister, ObjectReader, Received

__all__ = ["LISTING_SCHEMA", "Lister", "Listener", "ObjectReader", "Received"]
