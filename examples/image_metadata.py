"""Recipe: image metadata with Pillow, as a per-file UDF pipeline over a volume stream.

For each new or changed image: format, width, height, mode, and where present the EXIF
DateTimeOriginal (as `taken_at`, UTC: converted with OffsetTimeOriginal when the camera wrote
one, else the camera's local time read as UTC), Make and Model. Every image is fully decoded,
so a truncated or corrupt file fails and lands in the errors table (`<target>_errors`, with
the error and traceback) while the other images are committed.

    python examples/image_metadata.py                     # self-contained: sample images
    python examples/image_metadata.py --warehouse W --volume landing [--target image_meta]
    volume-stream run examples/pipelines/image_metadata.toml   # the same as a scheduled job

With `--warehouse/--volume` it runs on an existing volume (the demo's: `python
examples/demo.py --workdir /tmp/vs-demo`, then `--warehouse /tmp/vs-demo/warehouse --volume
landing`), creating the stream `image_files` (with the files already there) if needed.
"""

from __future__ import annotations

import argparse
import atexit
import io
import shutil
import tempfile
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

from PIL import Image

import volume_stream as vs

SCHEMA = ("format string, width int, height int, mode string, taken_at timestamp, "
          "camera_make string, camera_model string")
IMAGE_GLOBS = ["*.jpg", "*.jpeg", "*.JPG", "*.JPEG", "*.png", "*.PNG", "*.gif", "*.webp",
               "*.tif", "*.tiff", "*.bmp"]
_EXIF_IFD = 0x8769
_MAKE, _MODEL, _DATETIME = 0x010F, 0x0110, 0x0132
_DATETIME_ORIGINAL, _OFFSET_TIME_ORIGINAL = 0x9003, 0x9011


def _text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    text = str(value).strip("\x00 ").strip()
    return text or None


def _taken_at(exif: Image.Exif) -> datetime | None:
    sub = exif.get_ifd(_EXIF_IFD)
    raw = _text(sub.get(_DATETIME_ORIGINAL) or exif.get(_DATETIME))
    if raw is None:
        return None
    try:
        local = datetime.strptime(raw[:19], "%Y:%m:%d %H:%M:%S")
    except ValueError:
        return None  # a malformed date is metadata we do not have, not a broken image
    tz: timezone = UTC
    offset = _text(sub.get(_OFFSET_TIME_ORIGINAL))
    if offset and len(offset) == 6 and offset[0] in "+-":
        try:
            hours, minutes = int(offset[1:3]), int(offset[4:6])
            sign = 1 if offset[0] == "+" else -1
            tz = timezone(sign * timedelta(hours=hours, minutes=minutes))
        except ValueError:
            pass
    return local.replace(tzinfo=tz).astimezone(UTC)


@vs.file_udf(SCHEMA)
def image_metadata(file: vs.FileRecord) -> dict:
    """Pillow's view of one image; raises on files that are not complete images."""
    with file.open() as f, Image.open(f) as img:
        exif = img.getexif()
        row = {"format": img.format, "width": img.width, "height": img.height,
               "mode": img.mode, "taken_at": _taken_at(exif),
               "camera_make": _text(exif.get(_MAKE)), "camera_model": _text(exif.get(_MODEL))}
        img.load()  # decode every pixel: a truncated file raises here
    return row


def make_samples(folder: Path) -> None:
    """A JPEG with EXIF, a PNG without, and a truncated JPEG (which must fail)."""
    folder.mkdir(parents=True, exist_ok=True)
    exif = Image.Exif()
    exif[_MAKE], exif[_MODEL] = "Canon", "EOS 5D"
    exif.get_ifd(_EXIF_IFD)[_DATETIME_ORIGINAL] = "2024:05:01 10:30:00"
    exif.get_ifd(_EXIF_IFD)[_OFFSET_TIME_ORIGINAL] = "+02:00"
    Image.new("RGB", (640, 480), (200, 40, 40)).save(folder / "camera.jpg", exif=exif)
    Image.new("RGBA", (32, 16), (0, 0, 255, 128)).save(folder / "icon.png")
    buf = io.BytesIO()
    Image.effect_noise((400, 300), 60).convert("RGB").save(buf, "JPEG", quality=90)
    (folder / "broken.jpg").write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warehouse", type=Path, help="an existing warehouse")
    parser.add_argument("--volume", help="the volume to read (with --warehouse)")
    parser.add_argument("--stream", default="image_files")
    parser.add_argument("--keep", action="store_true",
                        help="keep the sample folder and warehouse (default: removed at exit)")
    parser.add_argument("--target", default="image_meta")
    args = parser.parse_args()
    if (args.warehouse is None) != (args.volume is None):
        parser.error("--warehouse and --volume go together")
    if args.warehouse is None:
        work = Path(tempfile.mkdtemp(prefix="vs-image-metadata-"))
        if not args.keep:  # a recipe's samples are not worth a folder left in /tmp
            atexit.register(shutil.rmtree, work, True)
        make_samples(work / "images")
        cat = vs.connect(work / "warehouse")
        cat.create_volume("images", work / "images")
        args.volume = "images"
        print(f"sample images in {work / 'images'}, warehouse {work / 'warehouse'}"
              f"{'' if args.keep else ' (removed at exit; --keep keeps them)'}")
    else:
        cat = vs.connect(args.warehouse)
    if args.stream not in {s["name"] for s in cat.list_streams()}:
        cat.create_stream(args.stream, on_volume=args.volume, show_initial_rows=True)
    cat.refresh(args.volume)  # pick up files added since (a running `watch` does this too)
    pipeline = cat.pipeline(args.stream, image_metadata, args.target, path_glob=IMAGE_GLOBS)
    print(pipeline.run_once().as_dict())
    spark = cat.spark
    from deltalake import DeltaTable

    for uri, columns in ((pipeline.target_uri, ["relative_path", "format", "width", "height",
                                                "mode", "taken_at", "camera_make",
                                                "camera_model"]),
                         (pipeline.errors_uri, ["relative_path", "error", "attempt"])):
        table = DeltaTable(uri).to_pyarrow_table(columns=columns)
        print(uri)
        spark.createDataFrame(table).orderBy("relative_path").show(truncate=60)


if __name__ == "__main__":
    main()
