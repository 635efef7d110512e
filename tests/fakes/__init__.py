"""Local wire fakes of Alibaba Cloud MNS and OSS for tests (see mns_server.py, oss_server.py).

They run on 127.0.0.1 in daemon threads named `fake-*`; tests drive them with the real
aliyun-mns-sdk and oss2 clients over HTTP. Fixtures live in tests/alicloud_fixtures.py.
"""

from tests.fakes.mns_server import FakeMnsServer, MnsBackend, MnsError
from tests.fakes.oss_server import DEFAULT_EVENTS, FakeOssServer, NotificationRule, OssBackend

__all__ = ["DEFAULT_EVENTS", "FakeMnsServer", "FakeOssServer", "MnsBackend", "MnsError",
           "NotificationRule", "OssBackend"]
