"""How the CLI shows things: data verbatim in tables (no emoji, no markup), advice in the form of
the front door used (a flag on the command line, a clause in SQL), help readable at 80 columns,
counts in the singular when there is one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import typer
from typer.testing import CliRunner

from volume_stream.cli import app

runner = CliRunner()
SCRIPT = str(Path(sys.executable).parent / "volume-stream")
ARN = "acs:ram::1450476637304722:role/czvolumestreamrole"


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "VOLUME_STREAM_WAREHOUSE"}
    return subprocess.run([SCRIPT, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=env)


def test_tables_show_data_verbatim(tmp_path):
    wh = ["--warehouse", str(tmp_path / "wh")]
    created = runner.invoke(app, ["sql", *wh, "-e", (
        f"CREATE STORAGE CONNECTION c TYPE OSS REGION = 'cn-shanghai' ROLE_ARN = '{ARN}' "
        f"ENDPOINT = 'oss-cn-shanghai.aliyuncs.com' COMMENT = '[bold]:smile: raw[/bold]'")])
    assert created.exit_code == 0, created.output
    shown = runner.invoke(app, ["sql", *wh, "-e", "DESCRIBE CONNECTION c"])
    assert shown.exit_code == 0, shown.output
    assert ARN in shown.stdout and "\N{RAM}" not in shown.stdout
    assert "[bold]:smile: raw[/bold]" in shown.stdout


def test_errors_give_the_remedy_of_the_front_door_used(tmp_path):
    (tmp_path / "data").mkdir()
    assert cli("volume", "create", "v", "data", cwd=tmp_path).returncode == 0
    again = cli("volume", "create", "v", "data", cwd=tmp_path)
    assert again.returncode == 1
    assert "volume 'v' already exists; add --replace to replace it" in again.stderr
    assert cli("stream", "create", "s", "--on", "v", cwd=tmp_path).returncode == 0
    drop = cli("volume", "drop", "v", cwd=tmp_path)
    assert drop.returncode == 1 and "drop them first or add --cascade" in drop.stderr
    sql = cli("sql", "-e", f"CREATE EXTERNAL VOLUME v LOCATION '{tmp_path / 'data'}'",
              cwd=tmp_path)
    assert sql.returncode == 1
    assert ("volume 'v' already exists; write CREATE OR REPLACE to replace it, or IF NOT "
            "EXISTS to keep it") in sql.stderr
    sql = cli("sql", "-e", "DROP VOLUME v", cwd=tmp_path)
    assert "drop them first or write DROP VOLUME v CASCADE" in sql.stderr
    for proc in (again, drop, sql):
        assert "replace=True" not in proc.stderr and "cascade=True" not in proc.stderr
        assert "Traceback" not in proc.stderr


def _commands(group, path: tuple[str, ...] = ()):
    for name, command in group.commands.items():
        if hasattr(command, "commands"):  # a group
            yield from _commands(command, path + (name,))
        else:
            yield path + (name,), command


def test_help_at_80_columns_keeps_option_names_whole():
    root = typer.main.get_command(app)
    seen = 0
    for path, command in _commands(root):
        result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80"})
        assert result.exit_code == 0, result.output
        text = result.output
        assert "<bool>" not in text and "…" not in text, text
        assert max(len(line) for line in text.splitlines()) <= 80, text
        for param in command.params:
            for opt in param.opts + param.secondary_opts:
                if opt.startswith("-"):
                    assert opt in text, (path, opt, text)
        seen += 1
    assert seen >= 14  # every command was looked at


def test_timestamps_print_with_their_utc_offset_whether_naive_or_aware(capsys):
    from datetime import UTC, datetime, timedelta, timezone

    from volume_stream.cli._common import print_rows

    naive = datetime(2026, 1, 2, 3, 4, 5)  # delta-rs's naive UTC
    aware = datetime(2026, 1, 2, 4, 4, 5, tzinfo=timezone(timedelta(hours=1)))
    print_rows([{"a": naive, "b": aware, "c": naive.replace(tzinfo=UTC)}], as_json=True)
    assert capsys.readouterr().out.strip() == (
        '{"a": "2026-01-02T03:04:05+00:00", "b": "2026-01-02T03:04:05+00:00", '
        '"c": "2026-01-02T03:04:05+00:00"}')
