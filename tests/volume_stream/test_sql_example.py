"""The seed's image-recognition example (examples/image_recognition.sql): its statements run as
written, with the AI function `public.fc_image_to_text` provided by a Python UDF of that name.

The script as written registers an OSS volume fed by MNS (nothing is contacted at creation), so
it runs end to end with nothing pending. The same pipeline then runs on real image files, with
statement 3 swapped for the local variant given in the example's own header."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from volume_stream.sql import run_script, statements
from volume_stream.sql.ddl import parse
from volume_stream.sql.volume_plan import plan_volume

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "image_recognition.sql"
COLOURS = {"red": (200, 30, 30), "green": (30, 180, 40), "blue": (20, 40, 210)}


def fc_image_to_text(task: str, url: str) -> str:
    """The stand-in for the seed's cloud AI function: names the image's dominant colour."""
    from urllib.parse import unquote, urlparse

    from PIL import Image

    with Image.open(unquote(urlparse(url).path)) as image:
        r, g, b = image.convert("RGB").resize((1, 1)).getpixel((0, 0))
        size, kind = image.size, image.format
    colour = max((("red", r), ("green", g), ("blue", b)), key=lambda c: c[1])[0]
    return f"{task}: {colour} dish ({size[0]}x{size[1]} {kind})"


def image(path: Path, colour: str, fmt: str) -> None:
    from PIL import Image

    Image.new("RGB", (8, 6), COLOURS[colour]).save(path, fmt)


def test_the_example_is_the_seed_and_runs_as_written(catalog, db):
    text = EXAMPLE.read_text()
    found = statements(text)
    assert [" ".join(t.value.upper() for t in s.tokens[:3]) for s in found] == [
        "CREATE STORAGE CONNECTION", "DESCRIBE CONNECTION CONN_SH_OSS",
        "CREATE EXTERNAL VOLUME", "CREATE TABLE IF", "CREATE STREAM IF", "INSERT INTO DISH_RECOGNITION_RESULTS",
        "SELECT FILE_PATH ,", "SELECT RECOGNIZED_CONTENT ,"]
    catalog.register_udf("fc_image_to_text", fc_image_to_text, "string")
    results = list(run_script(catalog, text))
    assert len(results) == 8
    external_id = {r["property"]: r["value"] for r in results[1]}["external_id"]
    assert re.fullmatch(r"[0-9a-f]{16}", external_id)
    assert results[2].message == ("created volume vol_dish_images at "
                                  "oss://sh-oss-derek/dish-images/")
    spec = catalog.warehouse.read()[("volume", "vol_dish_images")]
    assert spec["notification"] == {
        "type": "ALICLOUD_MNS", "endpoint": "https://1450476637304722.mns.cn-shanghai.aliyuncs.com",
        "queue_name": "cz-queue-mns-ossevent"}
    assert spec["options"] == {"endpoint": "oss-cn-shanghai.aliyuncs.com",  # the role is assumed
                               "role_arn": "acs:ram::1450476637304722:role/czvolumestreamrole"}
    assert spec["recursive"]
    assert results[4].message == ("created stream str_dish_images on vol_dish_images (STANDARD) "
                                  "at version 0")
    assert results[5].message == "INSERT: ok; stream str_dish_images: nothing pending"
    assert results[6].rows == [] and results[7].rows == []
    # statement 3 as written is the MNS mapping
    plan = plan_volume(catalog, parse(found[2]))
    assert plan.notification.type == "ALICLOUD_MNS"
    assert plan.metadata["virtual_cluster"] == "DEFAULT"


def _local_variant(text: str, folder: Path) -> str:
    """The header's local version of statement 3, uncommented, pointed at `folder`."""
    block = re.search(r"^--     (CREATE EXTERNAL VOLUME IF NOT EXISTS vol_dish_images\n.*?;)$", text,
                      re.M | re.S).group(1)
    sql = "\n".join(line.removeprefix("--     ") for line in block.splitlines())
    return sql.replace("/path/to/dish-images/", f"{folder}/")


def test_the_pipeline_recognises_each_new_or_replaced_image_once(catalog, db, tmp_path):
    folder = tmp_path / "dish-images"
    (folder / "lunch").mkdir(parents=True)
    text = EXAMPLE.read_text()
    script = statements(text)
    catalog.register_udf("fc_image_to_text", fc_image_to_text, "string")

    def run(index: int):
        return list(run_script(catalog, script[index].text))[0]

    run(0)
    catalog.sql(_local_variant(text, folder))
    run(3)
    run(4)
    image(folder / "tomato.png", "red", "PNG")
    image(folder / "lunch" / "salad.JPG", "green", "JPEG")
    (folder / "notes.txt").write_text("not an image")
    catalog.sql("ALTER VOLUME vol_dish_images REFRESH")  # what the listener does on events
    first = run(5)
    assert first.offsets["str_dish_images"] == {"start": 0, "end": 1, "batch_id": 0,
                                                 "records": 3}
    latest = run(6).rows
    assert sorted((r["file_path"], r["recognized_content"], r["change_type"]) for r in latest) == [
        ("lunch/salad.JPG", "dish_recognition: green dish (8x6 JPEG)", "INSERT"),
        ("tomato.png", "dish_recognition: red dish (8x6 PNG)", "INSERT")]
    # running the consumer again recognises nothing twice
    assert run(5).message == "INSERT: ok; stream str_dish_images: nothing pending"
    # a replaced image comes back as UPDATE_AFTER; a deleted one is skipped
    image(folder / "tomato.png", "blue", "PNG")
    (folder / "lunch" / "salad.JPG").unlink()
    catalog.sql("ALTER VOLUME vol_dish_images REFRESH")
    assert run(5).offsets["str_dish_images"]["end"] == 2
    counts = {r["recognized_content"]: r["cnt"] for r in run(7)}
    assert counts == {"dish_recognition: green dish (8x6 JPEG)": 1,
                      "dish_recognition: red dish (8x6 PNG)": 1,
                      "dish_recognition: blue dish (8x6 PNG)": 1}
    rows = catalog.sql("SELECT file_path, change_type, commit_version "
                       "FROM dish_recognition_results ORDER BY commit_version, file_path").rows
    assert [(r["file_path"], r["change_type"], r["commit_version"]) for r in rows] == [
        ("lunch/salad.JPG", "INSERT", 1), ("tomato.png", "INSERT", 1),
        ("tomato.png", "UPDATE_AFTER", 2)]


@pytest.mark.slow  # a second process with its own Spark JVM: make soak
def test_the_script_runs_again_in_a_new_process(tmp_path):
    """Its header says to run it from cron: a second run, in a new process, leaves the
    connection and the volume as they are and consumes nothing twice."""
    import subprocess
    import sys

    (tmp_path / "recognisers.py").write_text(
        "def recognise(task, url):\n    return task + ': ' + url.rsplit('/', 1)[-1]\n")
    command = [str(Path(sys.executable).parent / "volume-stream"), "sql", str(EXAMPLE),
               "--udf", "fc_image_to_text=recognisers:recognise", "--warehouse", "wh"]
    runs = [subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
            for _ in range(2)]
    assert runs[0].returncode == 0, runs[0].stdout[-2000:] + runs[0].stderr[-4000:]
    first, second = (" ".join(run.stdout.split()) for run in runs)
    assert "created connection conn_sh_oss" in first
    assert "created volume vol_dish_images" in first
    assert "connection conn_sh_oss exists; left as it is" in second
    assert "volume vol_dish_images exists; left as it is" in second
    if runs[1].returncode != 0:
        # statement 4: Spark's in-memory catalog forgets the table, its folder stays
        assert "LOCATION_ALREADY_EXISTS" in runs[1].stderr, runs[1].stderr[-4000:]
        assert "dish_recognition_results" in runs[1].stderr
        pytest.xfail("CREATE TABLE IF NOT EXISTS in ./spark-warehouse fails in a new process "
                     "(tables in the warehouse: issue 14, the table streams work)")
    assert "INSERT: ok; stream str_dish_images: nothing pending" in second
