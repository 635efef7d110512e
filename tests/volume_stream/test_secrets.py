"""One secrets list (connectors/secrets.py) serves the volume spec, notifications, the daemon's
configuration, SQL connections and log masking."""

from __future__ import annotations

import pytest

from connectors.secrets import SECRET_KEYS, is_secret
from volume_stream.config.daemon import DaemonConfig
from volume_stream.daemon.logs import secret_values
from volume_stream.errors import ConfigError
from volume_stream.volumes import SqsNotification, VolumeSpec

# the union of the lists kept before in volumes, config, SQL and logs
EARLIER = {"aws_secret_access_key", "aws_session_token", "access_key_secret", "security_token",
           "secret_access_key", "password", "token", "aws_access_key_id", "access_key_id",
           "session_token", "secret"}


def test_every_earlier_name_is_a_secret():
    assert EARLIER <= SECRET_KEYS
    assert all(is_secret(k) and is_secret(k.upper()) for k in EARLIER)
    for name in ("OSS_ACCESS_ID", "MY_PASSWD", "DB_CREDENTIALS", "GITHUB_TOKEN"):
        assert is_secret(name)
    for name in ("region_name", "endpoint_url", "queue_url", "include", "max_workers", "HOME"):
        assert not is_secret(name)


def test_stored_forms_drop_every_secret():
    spec = VolumeSpec(name="v", id="1", location="s3://b/p/",
                      options={"session_token": "t", "secret": "s", "region_name": "eu"})
    assert spec.to_dict()["options"] == {"region_name": "eu"}
    note = SqsNotification("https://q", aws_session_token="t", max_workers=2)
    assert note.to_dict() == {"type": "AWS_SQS", "queue_url": "https://q", "max_workers": 2}
    assert "'t'" not in repr(note)


def test_the_daemon_config_refuses_secrets(tmp_path):
    for key in ("access_key_secret", "secret", "session_token"):
        file = tmp_path / f"{key}.toml"
        file.write_text(f'[volumes.v]\nlocation = "s3://b/p/"\noptions = {{ {key} = "x" }}\n')
        with pytest.raises(ConfigError, match=f"{key}' is a secret"):
            DaemonConfig.load(file)


def test_log_masking_uses_the_same_list():
    values = secret_values({"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE1", "HOME": "/root/home"})
    assert values == ("AKIAEXAMPLE1",)
