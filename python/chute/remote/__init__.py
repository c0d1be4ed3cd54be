"""Reading shards where training data lives: http(s)://, s3://, gs://,
az:// and hf:// urls (and their aliases: the engine's table,
``_core.remote_schemes()``), through obstore (``pip install 'chute[remote]'``).

The engine's remote byte sources (csrc/io/remote_source.h) never call Python:
they put range requests on a native FetchQueue, and a RemoteSession's fetcher
thread performs them with obstore and hands the bytes back. Objects are read
in large ranges, several ahead, within a per-process byte budget, retried
with backoff, and optionally cached once per node (``cache_dir``).

    from chute.remote import RemoteOptions, get_session

    session = get_session(RemoteOptions(cache_dir="/local/cache"))
    with session.open("s3://bucket/train/shard-000000.tar") as f:
        data = f.read()
    urls = session.list_objects("s3://bucket/train/*.tar")

For a native source, ``session.source_options()`` holds the SourceOptions
fields (the queue, the cache settings).
"""

from chute.remote._options import RemoteOptions
from chute.remote._session import RemoteFile, RemoteSession, get_session
from chute.remote._stores import (
    RemoteDependencyError,
    RemoteForkError,
    is_remote_url,
    resolve_hf,
)

__all__ = [
    "RemoteDependencyError",
    "RemoteFile",
    "RemoteForkError",
    "RemoteOptions",
    "RemoteSession",
    "get_session",
    "is_remote_url",
    "list_objects",
    "open_url",
    "resolve_hf",
]


def open_url(url: str, options: RemoteOptions | None = None) -> RemoteFile:
    """Opens a remote object with the process's session for ``options``."""
    return get_session(options).open(url)


def list_objects(pattern: str, options: RemoteOptions | None = None) -> list[str]:
    """Object urls matching a glob on a bucket, sorted (see RemoteSession.list_objects)."""
    return get_session(options).list_objects(pattern)
