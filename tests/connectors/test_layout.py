"""The connectors' layout: the old re-exporting modules are gone, loggers keep their names
(`connectors.sqs`, ...: what users configure logging by), every module stays within 500 lines,
and `connectors` never imports `volume_stream`."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "connectors"

#: the modules that only re-exported moved names, removed (issue 24): import the real module
REMOVED = ["connectors.base", "connectors.s3", "connectors.sqs", "connectors.oss",
           "connectors.mns", "connectors._aws", "connectors._alicloud"]


@pytest.mark.parametrize("old", REMOVED)
def test_compatibility_modules_are_gone(old):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)


def test_listeners_and_transient_rule_live_in_their_packages():
    from connectors import errors, local
    from connectors.alicloud import client as alicloud_client
    from connectors.alicloud.listener import MnsListener
    from connectors.aws import client as aws_client
    from connectors.aws.listener import SqsListener
    from connectors.local.listener import LocalListener

    assert SqsListener.__module__ == "connectors.aws.listener"
    assert MnsListener.__module__ == "connectors.alicloud.listener"
    assert local.LocalListener is LocalListener and local.LocalLister and local.LocalReader
    assert aws_client.ClientOptions and alicloud_client.AliCloudOptions and errors.is_transient


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
