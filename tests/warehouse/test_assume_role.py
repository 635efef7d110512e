"""`role_arn`: the AWS connectors assume the role through STS (moto's STS in its own process)
and refresh the temporary credentials before they expire; a volume with `role_arn` (or from a
`CREATE STORAGE CONNECTION ... ROLE_ARN`) reads S3 with the role's credentials only."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import volume_stream as vs
from connectors.aws.client import ClientOptions
from tests.fakes.strip_proxy import StripProxy
from tests.s3_warehouse_fixtures import s3_client

ROLE = "arn:aws:iam::123456789012:role/volume-stream-reader"


def test_role_is_assumed_and_refreshed_before_expiry(s3_env, s3_bucket):
    opts = ClientOptions.of(role_arn=ROLE, endpoint_url=s3_env, region_name="us-east-1")
    session = opts.session()
    creds = session.get_credentials()
    assert creds.method == "sts-assume-role"
    first = creds.get_frozen_credentials()
    assert first.access_key != "testing" and first.token
    s3 = opts.client("s3", session=session)
    assert s3_bucket in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    # as if the credentials were about to expire: botocore refreshes them through STS
    creds._expiry_time = datetime.now(UTC) + timedelta(seconds=30)
    second = creds.get_frozen_credentials()
    assert second.access_key != first.access_key


def test_a_volume_with_role_arn_reads_s3_with_the_roles_credentials(s3_env, s3_bucket,
                                                                   tmp_path):
    s3_client(s3_env).put_object(Bucket=s3_bucket, Key="data/a.txt", Body=b"a")
    # the proxy refuses every S3 request not signed with temporary (assumed) credentials
    with StripProxy(s3_env, allowed_key_prefix="ASIA") as proxy:
        proxy.start()
        cat = vs.connect(tmp_path / "wh")
        cat.create_volume("plain", f"s3://{s3_bucket}/data/", endpoint_url=proxy.endpoint)
        try:
            cat.refresh("plain")
            raised = None
        except vs.VolumeStreamError as exc:
            raised = exc
        assert raised is not None  # the environment's long-term keys are refused
        cat.create_volume("roled", f"s3://{s3_bucket}/data/", endpoint_url=proxy.endpoint,
                          role_arn=ROLE)
        assert cat.refresh("roled").inserted == 1
        assert cat.volume_spec("roled").options["role_arn"] == ROLE  # stored: not a secret
