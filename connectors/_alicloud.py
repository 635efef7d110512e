"""Old home of the Alibaba Cloud helpers; they live in `connectors.alicloud.client` now."""

from connectors.alicloud.client import (
    ENV_ACCESS_KEY_ID,
    ENV_ACCESS_KEY_SECRET,
    ENV_SECURITY_TOKEN,
    AliCloudCredentials,
    AliCloudOptions,
    translate_mns_errors,
    translate_oss_errors,
)
from connectors.errors import is_transient

#: the one rule (`connectors.errors.is_transient`) under the names it had per service
is_transient_mns = is_transient_oss = is_transient

__all__ = [
    "ENV_ACCESS_KEY_ID", "ENV_ACCESS_KEY_SECRET", "ENV_SECURITY_TOKEN", "AliCloudCredentials",
    "AliCloudOptions", "is_transient", "is_transient_mns", "is_transient_oss",
    "translate_mns_errors", "translate_oss_errors",
]
