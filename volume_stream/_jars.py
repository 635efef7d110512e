"""The JVM jars volume-stream's local Spark runs with, fetched once by `make install` into the
virtual environment (`<venv>/jars/`, or `$VOLUME_STREAM_JARS`), so that no test, demo or job
ever downloads anything while it runs and everything works offline afterwards:

* `delta/`: Delta Lake's own Spark connector (`io.delta:delta-spark_2.13`, the version of the
  `delta-spark` Python package, with its dependencies), so Spark reads and writes the
  warehouse's Delta tables with `format("delta")` (docs/spark-delta.md);
* `s3/`: `org.apache.hadoop:hadoop-aws` of the Hadoop version bundled with PySpark, and the AWS
  SDK bundle it needs, for `s3a://` paths: ~690 MB, so fetched only where Spark reads S3
  (`volume-stream jars fetch s3`, or `make install JARS="delta s3"` as CI does); a Spark
  write to S3 without them is a `ConfigError` naming that command (`require`).

    python -m volume_stream._jars fetch delta   # what `make install` runs (idempotent)
    python -m volume_stream._cds                # then this: the class-data archive (below)
    python -m volume_stream._jars status        # or `volume-stream jars status`

`spark-classes.jsa` beside them is a Java class-data archive (CDS) of the ~13,000 classes a
local Spark session with Delta Lake loads: a JVM that maps it skips parsing and verifying them,
which is most of a driver's start-up CPU. `make install` builds it by running a small Spark
workload in a JVM that writes the archive at exit (`volume_stream._cds`); `volume_stream._spark`
maps it when present.
The JVM itself checks the archive against its own build and the class path, and ignores it
(silently) when either changed, so a stale archive costs nothing but the saving.

The resolution is Spark's own (Ivy, `spark.jars.packages`, Maven Central), run once in a
throwaway JVM; each group's resolved jars are moved into its folder with a `COORDINATES` file
naming what was resolved, so a version change fetches again. `volume_stream._spark` puts the
jars of the complete groups on the driver's and executors' class path.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

from volume_stream.errors import ConfigError

__all__ = ["ARCHIVE", "DELTA_CONF", "GROUPS", "QUIET_CDS", "archive_options", "class_path",
           "coordinates", "fetch", "jars_dir", "require"]

#: the groups, what each is for and its size (measured: delta-spark 4.4, PySpark 4.2's Hadoop)
GROUPS = {"delta": "Delta Lake's Spark connector, for format(\"delta\"), 13 MB",
          "s3": "hadoop-aws and the AWS SDK bundle, for s3a:// paths, ~690 MB"}

#: the settings that turn on Delta Lake's SQL extension and catalog (when its jars are present);
#: a snapshot's log replay in 2 partitions, not 50: the embedded session reads small logs, and
#: 50 tasks made every time-travel read 3-5x slower on a 2-core machine
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.databricks.delta.snapshotPartitions": "2",
}
_MARKER = "COORDINATES"


def jars_dir() -> Path:
    """`$VOLUME_STREAM_JARS`, else `jars/` in the running virtual environment."""
    configured = os.environ.get("VOLUME_STREAM_JARS")
    return Path(configured) if configured else Path(sys.prefix) / "jars"


def _hadoop_version() -> str:
    """The Hadoop version bundled with the installed PySpark (its hadoop-client-api jar)."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    for jar in sorted(jars.glob("hadoop-client-api-*.jar")):
        return jar.name[len("hadoop-client-api-"):-len(".jar")]
    raise RuntimeError(f"no hadoop-client-api jar in {jars}: is PySpark installed?")


def coordinates() -> dict[str, list[str]]:
    """The Maven coordinates of each group, for the installed `delta-spark` and PySpark."""
    delta = metadata.version("delta-spark")
    return {"delta": [f"io.delta:delta-spark_2.13:{delta}"],
            "s3": [f"org.apache.hadoop:hadoop-aws:{_hadoop_version()}"]}


def _complete(group: str, wanted: list[str]) -> list[Path] | None:
    folder = jars_dir() / group
    marker = folder / _MARKER
    if not marker.is_file() or marker.read_text().split() != wanted:
        return None
    jars = sorted(folder.glob("*.jar"))
    return jars or None


def class_path() -> list[str]:
    """Local paths of the jars of every complete group (empty when nothing was fetched, or the
    fetched versions no longer match the installed packages)."""
    try:
        wanted = coordinates()
    except (metadata.PackageNotFoundError, RuntimeError, ImportError):
        return []
    paths: list[str] = []
    for group, coords in wanted.items():
        paths += [str(p) for p in _complete(group, coords) or []]
    return paths


def has_delta() -> bool:
    """Whether Delta Lake's Spark connector is fetched (and matches the installed version)."""
    try:
        return _complete("delta", coordinates()["delta"]) is not None
    except (metadata.PackageNotFoundError, RuntimeError, ImportError):
        return False


def require(group: str, why: str) -> None:
    """A `ConfigError` naming the command that fetches `group` when its jars are missing (or
    stale); nothing when they are there or PySpark itself is missing (Spark says so then)."""
    try:
        wanted = coordinates()[group]
    except (metadata.PackageNotFoundError, RuntimeError, ImportError):
        return
    if _complete(group, wanted) is None:
        raise ConfigError(f"{why} needs the {group} jars ({GROUPS[group]}), which are not in "
                          f"{jars_dir() / group}: run `volume-stream jars fetch {group}` once")


#: where the jars come from (`$VOLUME_STREAM_MAVEN_REPO`: a mirror of it)
MAVEN_CENTRAL = "https://repo1.maven.org/maven2/"
_IVY_SETTINGS = """<ivysettings>
  <settings defaultResolver="central"/>
  <resolvers><ibiblio name="central" m2compatible="true" root="{root}"/></resolvers>
</ivysettings>
"""
def _classes(jar: Path) -> set[str]:
    with zipfile.ZipFile(jar) as z:
        return {n for n in z.namelist() if n.endswith(".class") and not n.startswith("META-INF/")}


def _spark_classes() -> set[str]:
    import pyspark

    found: set[str] = set()
    for jar in (Path(pyspark.__file__).parent / "jars").glob("*.jar"):
        found |= _classes(jar)
    return found


def stop_gateway(gateway, timeout: float | None = None) -> int | None:
    """Close a py4j gateway and the JVM it launched (the JVM exits when its stdin closes);
    returns the JVM's exit status (None when the gateway launched none)."""
    gateway.shutdown()
    proc = getattr(gateway, "proc", None)
    if proc is None:
        return None
    proc.stdin.close()
    return proc.wait(timeout=timeout)


def _resolve(coords: list[str], ivy: Path) -> list[Path]:
    """Resolve `coords` with Spark's own Ivy resolution (Maven Central only) in a JVM launched
    for that alone; its progress lines go to this process's stderr. Returns the resolved jars
    none of whose classes Spark ships itself: the others (Hadoop, Parquet, Jackson, log4j...
    of other versions) would shadow Spark's own on the class path."""
    from pyspark import SparkConf
    from pyspark.java_gateway import launch_gateway

    settings = ivy / "ivysettings.xml"
    root = os.environ.get("VOLUME_STREAM_MAVEN_REPO") or MAVEN_CENTRAL
    settings.write_text(_IVY_SETTINGS.format(root=root.rstrip("/") + "/"))
    conf = SparkConf(loadDefaults=False)
    conf.set("spark.jars.packages", ",".join(coords))
    conf.set("spark.jars.ivy", str(ivy))
    conf.set("spark.jars.ivySettings", str(settings))
    gateway = launch_gateway(conf)
    try:
        resolved = gateway.jvm.java.lang.System.getProperty("spark.jars") or ""
    finally:
        stop_gateway(gateway)
    paths = [Path(p.removeprefix("file:")) for p in resolved.split(",") if p]
    if not paths:
        raise RuntimeError(f"Spark resolved no jars for {coords}")
    spark_has = _spark_classes()
    return [p for p in paths if not _classes(p) & spark_has]


def fetch(groups: list[str] | None = None, *, out=sys.stderr) -> list[str]:
    """Fetch the groups that are missing or stale (all by default); a no-op when every one is
    complete. Returns the groups fetched."""
    wanted = coordinates()
    unknown = [g for g in groups or [] if g not in wanted]
    if unknown:
        raise ConfigError(f"unknown jar group {unknown[0]!r}; the groups: {', '.join(wanted)}")
    fetched = []
    for group in groups or list(wanted):
        coords = wanted[group]
        if _complete(group, coords) is not None:
            print(f"==> jars: {group} {' '.join(coords)} already in {jars_dir() / group}",
                  file=out)
            continue
        fetched.append(group)
        note = " (the AWS SDK bundle is large: several hundred MB)" if group == "s3" else ""
        print(f"==> jars: fetching {' '.join(coords)} and its dependencies from Maven "
              f"Central{note}", file=out, flush=True)
        folder = jars_dir() / group
        jars_dir().mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f"ivy-{group}-", dir=jars_dir()) as tmp:
            resolved = _resolve(coords, Path(tmp))
            staging = Path(tmp) / "out"
            staging.mkdir()
            for jar in resolved:
                shutil.move(str(jar), staging / jar.name)
            (staging / _MARKER).write_text("\n".join(coords) + "\n")
            shutil.rmtree(folder, ignore_errors=True)
            shutil.move(str(staging), folder)
        size = sum(p.stat().st_size for p in folder.glob("*.jar")) / 1e6
        print(f"==> jars: {group}: {len(resolved)} jars, {size:.0f} MB in {folder}", file=out,
              flush=True)
    return fetched


#: the class-data archive's file, in `jars_dir()`
ARCHIVE = "spark-classes.jsa"
#: the JVM's own messages about the archive (e.g. "shared class paths mismatch") stay unsaid
QUIET_CDS = "-Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"


def archive_options() -> str:
    """The driver JVM options that map the class-data archive, or "" when there is none."""
    path = jars_dir() / ARCHIVE
    return f"-XX:SharedArchiveFile={path} {QUIET_CDS}" if path.is_file() else ""


def _status(out=sys.stdout) -> int:
    wanted = coordinates()
    missing = 0
    for group, coords in wanted.items():
        jars = _complete(group, coords)
        state = f"{len(jars)} jars" if jars else \
            f"missing (`volume-stream jars fetch {group}` fetches it)"
        missing += jars is None
        print(f"{group}: {' '.join(coords)}: {state} in {jars_dir() / group}", file=out)
    return 1 if missing else 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    command, groups = (args[0], args[1:]) if args else ("status", [])
    if command == "fetch":
        fetch(groups or None)
        return 0
    if command == "status":
        return _status()
    print("usage: python -m volume_stream._jars fetch [delta|s3 ...] | status", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
