"""The connectors' layout: old import paths still give the same objects, loggers keep their
names, every module stays within 500 lines, and `connectors` never imports `volume_stream`."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "connectors"

OLD_TO_NEW = {
    "connectors.base": ("connectors.protocols",
                        ["LISTING_SCHEMA", "Listener", "Lister", "ObjectReader", "Received"]),
    "connectors.s3": ("connectors.aws.store", ["S3Reader", "S3Lister", "S3Scope", "s3_url",
                                               "normalize_etag", "normalize_prefix"]),
    "connectors.sqs": ("connectors.aws.events", ["ParsedMessage", "S3Record", "parse_message",
                                                 "to_file_event"]),
    "connectors.oss": ("connectors.alicloud.store", ["OssReader", "OssLister", "OssScope",
                                                     "oss_url", "normalize_etag"]),
    "connectors.mns": ("connectors.alicloud.events", ["ParsedMessage", "OssRecord",
                                                      "parse_message", "to_file_event",
                                                      "_tie_break"]),
    "connectors._aws": ("connectors.aws.client", ["ClientOptions", "translate_errors",
                                                  "region_from_queue_url", "error_code"]),
    "connectors._alicloud": ("connectors.alicloud.client", ["AliCloudOptions",
                                                            "translate_mns_errors",
                                                            "translate_oss_errors"]),
}


@pytest.mark.parametrize("old", sorted(OLD_TO_NEW))
def test_old_paths_give_the_same_objects(old):
    new, names = OLD_TO_NEW[old]
    old_module, new_module = importlib.import_module(old), importlib.import_module(new)
    for name in names:
        assert getattr(old_module, name) is getattr(new_module, name), (old, name)


def test_listeners_and_transient_rules_under_their_old_names():
    from connectors import _alicloud, _aws, errors, local, mns, sqs
    from connectors.alicloud.listener import MnsListener
    from connectors.aws.listener import SqsListener
    from connectors.local.listener import LocalListener

    assert sqs.SqsListener is SqsListener and mns.MnsListener is MnsListener
    assert local.LocalListener is LocalListener and local.LocalLister and local.LocalReader
    assert _aws.is_transient is _alicloud.is_transient_mns is _alicloud.is_transient_oss \
        is errors.is_transient


@pytest.mark.parametrize(("module", "logger"), [
    ("connectors.aws.listener", "connectors.sqs"), ("connectors.alicloud.listener", "connectors.mns"),
    ("connectors.aws.store", "connectors.s3"), ("connectors.alicloud.store", "connectors.oss"),
    ("connectors.local.listener", "connectors.local"), ("connectors.local.store", "connectors.local"),
])
def test_logger_names_are_pinned(module, logger):
    assert importlib.import_module(module).logger.name == logger


def test_modules_are_small_and_never_import_volume_stream():
    for path in sorted(ROOT.rglob("*.py")):
        text = path.read_text()
        assert text.count("\n") <= 500, f"{path} has more than 500 lines"
        for node in ast.walk(ast.parse(text)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] in ("volume_stream", "directory_table")
                           for n in names), f"{path} imports {names}"
