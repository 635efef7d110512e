"""`volume-stream jars`: the JVM jars a local Spark runs with (`volume_stream._jars`).

    volume-stream jars status          # what is fetched, what is missing
    volume-stream jars fetch s3        # hadoop-aws + the AWS SDK (~690 MB), for s3a:// paths

`make install` fetches Delta Lake's connector only; Spark reads and writes `s3://` warehouses
(pipeline targets, `format("delta")` over `table_path`) through `s3a://`, which needs the s3
group: fetch it once where that is used. A new group changes the driver's class path, so the
class-data archive is built again for it (`--no-archive`: leave it; the JVM then ignores it).
"""

from __future__ import annotations

from typing import Annotated

import typer

from volume_stream import _jars

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    jars_app = typer.Typer(help="Fetch and list the JVM jars of the local Spark.",
                           no_args_is_help=True, rich_markup_mode=None)
    app.add_typer(jars_app, name="jars")

    @jars_app.command("status")
    def status() -> None:
        """List each group of jars (delta, s3): fetched, or missing."""
        raise typer.Exit(_jars.main(["status"]))

    @jars_app.command("fetch")
    def fetch(
        groups: Annotated[list[str] | None, typer.Argument(
            help=f"Groups to fetch: {'; '.join(f'{k}: {v}' for k, v in _jars.GROUPS.items())}. "
                 f"Default: all.", show_default=False)] = None,
        archive: Annotated[bool, typer.Option(
            help="Build the class-data archive again for the new class path.")] = True,
    ) -> None:
        """Fetch the missing groups from Maven Central ($VOLUME_STREAM_MAVEN_REPO: a mirror)
        into $VOLUME_STREAM_JARS (default <venv>/jars); Ivy prints each download as it goes."""
        fetched = _jars.fetch(groups or None)
        if fetched and archive and (_jars.jars_dir() / _jars.ARCHIVE).is_file():
            from volume_stream._cds import build_archive  # Spark: only when rebuilding

            build_archive()
