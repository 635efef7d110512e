"""`volume_stream.__all__` is the public contract: every name resolves, and the catalog has the
methods the issues promise."""

from __future__ import annotations

import importlib

import volume_stream


def test_every_exported_name_resolves():
    for name in volume_stream.__all__:
        assert getattr(volume_stream, name) is not None, name


def test_catalog_contract_methods():
    catalog = importlib.import_module("volume_stream.catalog").Catalog
    for method in ["create_volume", "refresh", "watch", "create_stream", "read_stream",
                   "consume", "drop_stream", "drop_volume", "list_volumes", "list_streams",
                   "describe_stream", "pipeline", "sql", "register_udf"]:
        assert callable(getattr(catalog, method)), method


def test_errors_form_one_tree():
    for name in ["NotFoundError", "AlreadyExistsError", "StaleStreamError",
                 "ConsumeConflictError", "InvalidInputError", "ConfigError", "WarehouseError"]:
        assert issubclass(getattr(volume_stream, name), volume_stream.VolumeStreamError)
