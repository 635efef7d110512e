"""The SQL page's example UDF module: `volume-stream sql examples/image_recognition.sql --udf
fc_image_to_text=my_udfs:recognise` imports it (from the SQL file's folder, no PYTHONPATH)."""


def recognise(task: str, url: str) -> str:
    """Stands in for your model or a cloud AI call: names the task and the file."""
    return f"{task}: {url.rsplit('/', 1)[-1]}"
