"""What a user can set about remote reading, in one value."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MiB = 1 << 20


@dataclass(frozen=True)
class RemoteOptions:
    """How chute reads http(s)://, s3://, gs://, az:// and hf:// urls.

    Credentials, region and endpoint come from each store's standard
    environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
    ``AWS_REGION``, ``AWS_ENDPOINT_URL``, ``GOOGLE_APPLICATION_CREDENTIALS``,
    ``AZURE_STORAGE_ACCOUNT_NAME``, ...), read by the object-store client
    (obstore); ``storage_options`` overrides them with the client's own keys
    (e.g. ``{"endpoint": "http://127.0.0.1:9000", "region": "us-east-1"}``
    for S3). An ``http://`` endpoint is allowed when it is the one configured.

    storage_options: store configuration (obstore's S3Config, GCSConfig or
        AzureConfig keys), applied to every store opened.
    client_options: HTTP client settings (obstore's ClientConfig keys, such
        as ``root_certificate``); ``timeout_s`` fills ``timeout`` unless given.
    cache_dir: node-local directory shared by every process of the node; each
        object is downloaded once and later read as a local (mapped) file.
        ``pipe:`` urls use the same directory.
    cache_limit_bytes: bound on the cache's size (0: unbounded); least
        recently used entries are evicted, never one being read.
    cache_fsync: flush an entry to disk before publishing it.
    prefetch_bytes: fetched-but-unread bytes per process, over all objects.
    range_bytes: bytes per ranged request.
    max_in_flight: ranges requested ahead per object.
    max_concurrency: requests running at once per process.
    retries: further attempts after a timeout, a dropped connection, a short
        response, or a 5xx/408/429 answer (403/404 are not retried).
    backoff_s, max_backoff_s: retry delays grow from ``backoff_s`` doubling
        up to ``max_backoff_s``, each with random jitter.
    timeout_s: one attempt's limit.
    """

    storage_options: Mapping[str, Any] = field(default_factory=dict)
    client_options: Mapping[str, Any] = field(default_factory=dict)
    cache_dir: str | None = None
    cache_limit_bytes: int = 0
    cache_fsync: bool = True
    prefetch_bytes: int = 256 * MiB
    range_bytes: int = 8 * MiB
    max_in_flight: int = 4
    max_concurrency: int = 32
    retries: int = 5
    backoff_s: float = 0.25
    max_backoff_s: float = 8.0
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        positive = {
            "prefetch_bytes": self.prefetch_bytes,
            "range_bytes": self.range_bytes,
            "max_in_flight": self.max_in_flight,
            "max_concurrency": self.max_concurrency,
            "timeout_s": self.timeout_s,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"RemoteOptions.{name} must be positive, not {value!r}")
        non_negative = {
            "cache_limit_bytes": self.cache_limit_bytes,
            "retries": self.retries,
            "backoff_s": self.backoff_s,
            "max_backoff_s": self.max_backoff_s,
        }
        for name, value in non_negative.items():
            if value < 0:
                raise ValueError(f"RemoteOptions.{name} must not be negative, not {value!r}")

    def key(self) -> tuple[object, ...]:
        """A hashable identity: equal options share one session."""
        return (
            tuple(sorted((k, repr(v)) for k, v in self.storage_options.items())),
            tuple(sorted((k, repr(v)) for k, v in self.client_options.items())),
            self.cache_dir,
            self.cache_limit_bytes,
            self.cache_fsync,
            self.prefetch_bytes,
            self.range_bytes,
            self.max_in_flight,
            self.max_concurrency,
            self.retries,
            self.backoff_s,
            self.max_backoff_s,
            self.timeout_s,
        )
