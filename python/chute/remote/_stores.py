"""From a url to an object store and a path in it (obstore), and listing."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping
from datetime import timedelta
from types import ModuleType
from typing import Any
from urllib.parse import unquote, urlsplit

from chute import _core
from chute.remote._options import RemoteOptions

# The url schemes are the engine's table (csrc/io/remote_source.cc,
# remote_schemes()), the one place a scheme is added: name and aliases ->
# the kind of store that reads it.
_STORE_OF: dict[str, str] = {
    name: scheme.store
    for scheme in _core.remote_schemes()
    for name in (scheme.name, *scheme.aliases)
}
SCHEMES = tuple(_STORE_OF)
# The kinds of store made here (Stores._make); a new kind in the table needs
# its branch there. http(s) servers and the Hugging Face Hub have no listing
# and take no writes.
STORES = ("http", "s3", "gcs", "azure", "hf")
READ_ONLY_STORES = ("http", "hf")

# Where hf:// urls resolve, as huggingface_hub resolves them (HF_ENDPOINT overrides).
_HF_ENDPOINT = "https://huggingface.co"
_HF_REPO_TYPES = ("datasets", "spaces", "models")

_ENDPOINT_KEYS = ("endpoint", "aws_endpoint", "aws_endpoint_url", "endpoint_url")
_ENDPOINT_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT")


class RemoteDependencyError(ImportError):
    """Remote urls need the optional dependency obstore."""


class RemoteForkError(RuntimeError):
    """The object-store client cannot be used in a process forked after it was."""


_runtime_pid: int | None = None
_runtime_lock = threading.Lock()


def obstore_module() -> ModuleType:
    try:
        import obstore
    except ImportError as exc:
        named = ", ".join(f"{scheme.name}://" for scheme in _core.remote_schemes())
        raise RemoteDependencyError(
            f"reading remote urls ({named}) needs obstore: pip install 'chute[remote]'"
        ) from exc
    return obstore


def claim_runtime() -> None:
    """Called before the client does I/O: its runtime's threads do not survive
    a fork, and a forked child that uses it hangs. Fail clearly instead."""
    global _runtime_pid
    with _runtime_lock:
        if _runtime_pid is None:
            _runtime_pid = os.getpid()
        elif _runtime_pid != os.getpid():
            raise RemoteForkError(
                "this process was forked from one that had already read remote urls, and the "
                "object-store client (obstore) cannot run in such a child; start workers with "
                "multiprocessing's 'spawn' or 'forkserver' method, or read remote urls only in "
                "the parent"
            )


def runtime_claimed_here() -> bool:
    """Whether this process has used the client (a child forked from it
    could not: see claim_runtime)."""
    return _runtime_pid == os.getpid()


def scheme_of(url: str) -> str:
    i = url.find("://")
    return url[:i].lower() if i > 0 else ""


def is_remote_url(url: str) -> bool:
    return scheme_of(url) in SCHEMES


def store_of(url: str) -> str:
    """The kind of store that reads a url ("s3", "http", ...; "" when none)."""
    return _STORE_OF.get(scheme_of(url), "")


def _hf_token() -> str | None:
    try:
        from huggingface_hub import get_token
    except ImportError:
        return os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    token: str | None = get_token()
    return token


def resolve_hf(url: str) -> str:
    """``hf://datasets/{org}/{repo}[@{revision}]/{path}`` -> the hub's https
    url for that file (``{endpoint}/datasets/{org}/{repo}/resolve/{revision}/{path}``),
    as huggingface_hub's hf_hub_url builds it; models have no type prefix."""
    rest = url[len("hf://") :]
    parts = rest.split("/")
    kind = parts[0] if parts and parts[0] in _HF_REPO_TYPES else ""
    if kind:
        parts = parts[1:]
    if len(parts) < 3 or not all(parts[:3]):
        raise ValueError(f"cannot resolve {url!r}: expected hf://datasets/ORG/REPO/PATH")
    org, repo, path = parts[0], parts[1], "/".join(parts[2:])
    revision = "main"
    if "@" in repo:
        repo, revision = repo.split("@", 1)
    endpoint = os.environ.get("HF_ENDPOINT", _HF_ENDPOINT).rstrip("/")
    prefix = "" if kind in ("", "models") else kind + "/"
    return f"{endpoint}/{prefix}{org}/{repo}/resolve/{revision}/{path}"


def split_url(url: str) -> tuple[str, str]:
    """("scheme://authority", path of the object in that store). Object keys
    are taken literally ('?' and '#' are part of them); http(s) paths are
    percent-decoded, and a query string is refused because the store would
    drop it."""
    scheme = scheme_of(url)
    if scheme not in SCHEMES:
        raise ValueError(f"not a remote object url: {url!r}")
    if store_of(url) == "http":
        parts = urlsplit(url)
        if parts.query or parts.fragment:
            raise ValueError(
                f"cannot read {url!r}: query strings are not supported in http(s) urls"
            )
        if not parts.netloc:
            raise ValueError(f"not a remote object url: {url!r}")
        return f"{scheme}://{parts.netloc}", unquote(parts.path.lstrip("/"))
    rest = url[len(scheme) + 3 :]
    authority, _, path = rest.partition("/")
    if not authority:
        raise ValueError(f"not a remote object url: {url!r}")
    return f"{scheme}://{authority}", path


def _configured_endpoint(storage_options: Mapping[str, Any]) -> str:
    for key in _ENDPOINT_KEYS:
        value = storage_options.get(key)
        if isinstance(value, str):
            return value
    for var in _ENDPOINT_ENV:
        value = os.environ.get(var)
        if value:
            return value
    return ""


class Stores:
    """One obstore store per bucket/container/origin, made on first use."""

    def __init__(self, options: RemoteOptions) -> None:
        self._options = options
        self._stores: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()

    def _client_options(self, allow_http: bool, headers: Mapping[str, str]) -> dict[str, Any]:
        timeout = timedelta(seconds=self._options.timeout_s)
        client: dict[str, Any] = {
            "timeout": timeout,
            "connect_timeout": min(timeout, timedelta(seconds=30)),
        }
        if allow_http:
            client["allow_http"] = True
        if headers:
            client["default_headers"] = dict(headers)
        client.update(self._options.client_options)
        return client

    def resolve(self, url: str) -> tuple[Any, str]:
        """(store, path in it) for a remote url."""
        headers: dict[str, str] = {}
        if store_of(url) == "hf":
            url = resolve_hf(url)
            token = _hf_token()
            if token:
                headers["Authorization"] = f"Bearer {token}"
        root, path = split_url(url)
        if not path:
            raise ValueError(f"{url!r} names no object")
        key = (root, repr(sorted(headers.items())))
        with self._lock:
            store = self._stores.get(key)
            if store is None:
                store = self._make(url, root, headers)
                self._stores[key] = store
        return store, path

    def _make(self, url: str, root: str, headers: Mapping[str, str]) -> Any:
        obstore_module()
        from obstore.store import HTTPStore, from_url

        # chute retries by itself (csrc/io/fetch_queue.h), so that every
        # attempt is counted, bounded and cancellable.
        retry: Any = {"max_retries": 0}
        store = store_of(url)
        if store == "http":
            client: Any = self._client_options(scheme_of(url) == "http", headers)
            return HTTPStore.from_url(root, client_options=client, retry_config=retry)
        endpoint = _configured_endpoint(self._options.storage_options) if store == "s3" else ""
        client = self._client_options(endpoint.startswith("http://"), headers)
        config: Any = dict(self._options.storage_options) or None
        return from_url(root, config=config, client_options=client, retry_config=retry)


_GLOB_CHARS = re.compile(r"[*?\[]")


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """``*`` and ``?`` stay within a path segment, ``**`` crosses them,
    ``[...]`` is a character class."""
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 2)
            if end < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : end]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = end + 1
                continue
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out))


def list_objects(stores: Stores, pattern: str) -> list[str]:
    """The object urls matching a glob (sorted); without a glob, the objects
    under that prefix."""
    if not is_remote_url(pattern):
        raise ValueError(f"cannot list {pattern!r}: not a remote object url")
    if store_of(pattern) in READ_ONLY_STORES:
        raise ValueError(
            f"cannot list {pattern!r}: http(s) and hf:// servers offer no listing; "
            "name the objects (brace patterns such as shard-{000..127}.tar work)"
        )
    root, key = split_url(pattern)
    glob = _GLOB_CHARS.search(key)
    literal = key[: glob.start()] if glob else key
    prefix = literal[: literal.rfind("/") + 1] if glob else literal
    obstore = obstore_module()
    store, _ = stores.resolve(root + "/" + (key or "_"))
    claim_runtime()
    matcher = _glob_regex(key) if glob else None
    found: list[str] = []
    for chunk in obstore.list(store, prefix=prefix.rstrip("/") or None):
        for meta in chunk:
            path = meta["path"]
            if matcher is None or matcher.fullmatch(path):
                found.append(f"{root}/{path}")
    return sorted(found)
