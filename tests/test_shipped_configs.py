"""Every daemon config the project ships (docs/daemon.md, deploy/) passes `volume-stream config check`.

Each check runs in a fresh interpreter, as a user's shell would: the notification types of the
cloud providers must be known without anything having imported them first.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.docs_blocks import block

ROOT = Path(__file__).resolve().parents[1]


def _docs_daemon_toml() -> str:
    """The daemon page's configuration (its "daemon_toml" block, tests/docs_blocks.py)."""
    return block("daemon_toml")


def _configs() -> dict[str, str]:
    k8s = yaml.safe_load((ROOT / "deploy/k8s/configmap.yaml").read_text())
    return {
        "docs/daemon.md": _docs_daemon_toml(),
        "deploy/volume-stream.toml": (ROOT / "deploy/volume-stream.toml").read_text(),
        "deploy/compose/volume-stream.toml": (ROOT / "deploy/compose/volume-stream.toml").read_text(),
        "deploy/k8s/configmap.yaml": k8s["data"]["volume-stream.toml"],
        "examples/volume-stream.toml": (ROOT / "examples/volume-stream.toml").read_text(),
    }


def test_the_daemon_pages_config_passes_config_check_as_printed(tmp_path):
    """Issue 34 item 14: docs/daemon.md's configuration, saved in a project folder as the page
    says (its pipeline spec the shipped one, nothing made for it), passes `config check`."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")   # the project folder's files
    config = tmp_path / "volume-stream.toml"
    config.write_text(_docs_daemon_toml())
    proc = subprocess.run([sys.executable, "-m", "volume_stream.cli", "config", "check",
                           "volume-stream.toml"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "images" in proc.stdout + proc.stderr


@pytest.mark.parametrize("name", sorted(_configs()))
def test_shipped_config_passes_config_check_in_a_fresh_process(name, tmp_path):
    text = _configs()[name]
    config = tmp_path / "volume-stream.toml"
    config.write_text(text)
    # pipeline specs named by the config sit beside it, as they would in a deployment
    for spec in re.findall(r'spec\s*=\s*"([^"]+)"', text):
        target = tmp_path / spec
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text('stream = "s"\nudf = "m.py:f"\ntarget = "t"\n')
    proc = subprocess.run([sys.executable, "-m", "volume_stream.cli", "config", "check", str(config)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "not known" not in proc.stdout + proc.stderr
