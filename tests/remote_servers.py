"""Servers for the remote-reading tests, all on 127.0.0.1 and stopped by the
test that started them: an object server (HTTP with Range, HEAD, ETag and
If-Match), an HTTP proxy that injects faults in front of any server (the
object server or a local S3 server), and helpers for moto's S3 server."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import re
import select
import socket
import ssl
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    headers: dict[str, str]  # names lowercased


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: object, client_address: object) -> None:
        # Clients that hang up (a cancelled request, an injected drop) are expected.
        if not isinstance(sys.exc_info()[1], (ConnectionError, ssl.SSLError, TimeoutError)):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


class _Base:
    """A threaded HTTP server that records every request and can close its
    open connections when stopped (idle keep-alive connections would
    otherwise keep their handler threads in a blocking read)."""

    handler: type[BaseHTTPRequestHandler]

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._server = _Server(("127.0.0.1", 0), self.handler)
        self._server.owner = self  # type: ignore[attr-defined]
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.stopping = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> _Base:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            for s in list(self._sockets):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=10)

    def __enter__(self) -> _Base:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def record(self, req: Request) -> None:
        with self._lock:
            self.requests.append(req)

    def track(self, s: socket.socket, add: bool) -> None:
        with self._lock:
            if add:
                self._sockets.add(s)
            else:
                self._sockets.discard(s)

    def count(self, method: str, path_contains: str = "") -> int:
        with self._lock:
            return sum(1 for r in self.requests if r.method == method and path_contains in r.path)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 10  # an idle keep-alive connection is closed after this

    @property
    def owner(self) -> _Base:
        return self.server.owner  # type: ignore[attr-defined, no-any-return]

    def setup(self) -> None:
        super().setup()
        self.owner.track(self.connection, True)

    def finish(self) -> None:
        self.owner.track(self.connection, False)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: object) -> None:
        pass

    def record(self) -> None:
        self.owner.record(
            Request(
                self.command,
                self.path,
                self.headers.get("Range"),
                {k.lower(): v for k, v in self.headers.items()},
            )
        )


class _ObjectHandler(_Handler):
    owner: ObjectServer  # type: ignore[assignment]

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        self.record()
        server = self.owner
        path = self.path.split("?", 1)[0]
        target = server.redirects.get(path)
        if target is not None:
            self.send_response(302)
            self.send_header("Location", target)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = server.objects.get(path)
        if data is None:
            self._plain(404, b"no such object")
            return
        etag = server.etag(path) if server.with_etag else None
        want = self.headers.get("If-Match")
        # If-Match compares strongly: a weak ETag never matches (RFC 9110 13.1.1).
        strong = etag is not None and not etag.startswith("W/")
        if want is not None and etag is not None and want != "*" and (not strong or want != etag):
            self._plain(412, b"precondition failed")
            return
        start, end, status = 0, len(data), 200
        spec = self.headers.get("Range")
        if spec is not None:
            m = _RANGE.match(spec.strip())
            if m is None or (m.group(1) == "" and m.group(2) == ""):
                self._plain(416, b"bad range")
                return
            if m.group(1) == "":
                start = max(0, len(data) - int(m.group(2)))
            else:
                start = int(m.group(1))
                if m.group(2) != "":
                    end = min(len(data), int(m.group(2)) + 1)
            if start >= len(data) or start >= end:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        self.send_response(status)
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start))
        self.send_header("Last-Modified", "Mon, 02 Jan 2023 03:04:05 GMT")
        if etag is not None:
            self.send_header("ETag", etag)
        self.end_headers()
        if body:
            self.wfile.write(data[start:end])

    def _plain(self, status: int, text: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(text)


class ObjectServer(_Base):
    """Serves `objects` (path -> bytes, paths start with '/') with Range
    requests, a strong ETag per content (weak with `weak_etag`, none unless
    `with_etag`) and If-Match; `redirects` maps a path to a Location for a 302. With `tls`
    (a server-side SSLContext) it speaks https."""

    handler = _ObjectHandler

    def __init__(
        self, with_etag: bool = True, weak_etag: bool = False, tls: ssl.SSLContext | None = None
    ) -> None:
        super().__init__()
        self.objects: dict[str, bytes] = {}
        self.redirects: dict[str, str] = {}
        self.with_etag = with_etag
        self.weak_etag = weak_etag
        self.tls = tls
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def range_bytes(self, path_contains: str) -> int:
        """Bytes asked for by ranged GETs of matching paths (what was downloaded)."""
        total = 0
        with self._lock:
            for r in self.requests:
                if r.method == "GET" and path_contains in r.path and r.range:
                    m = _RANGE.match(r.range)
                    if m and m.group(1) and m.group(2):
                        total += int(m.group(2)) - int(m.group(1)) + 1
        return total

    def etag(self, path: str) -> str:
        tag = '"' + hashlib.sha1(self.objects[path]).hexdigest()[:16] + '"'
        return "W/" + tag if self.weak_etag else tag


@dataclass
class Fault:
    """What the proxy does to the next `times` requests that match.

    kind: "drop" (headers and half the body, then the connection is closed),
    "short" (a complete response that carries half the bytes it was asked
    for: 206 with a matching Content-Range and Content-Length), "status"
    (answers `status` itself), "delay" (waits `seconds`, then forwards),
    "stall" (waits until `release` is set, then forwards; gives up when the
    client closes the connection or the proxy stops). `range_start` limits
    the fault to ranged requests starting at that byte. `hit` is set when
    the fault is applied."""

    kind: str
    method: str = "GET"
    path_contains: str = ""
    times: int = 1
    status: int = 500
    seconds: float = 0.0
    range_start: int | None = None
    release: threading.Event = field(default_factory=threading.Event)
    hit: threading.Event = field(default_factory=threading.Event)


class _ProxyHandler(_Handler):
    owner: FaultProxy  # type: ignore[assignment]
    protocol_version = "HTTP/1.0"  # one request per connection: faults close it anyway

    def do_GET(self) -> None:
        self._forward()

    def do_HEAD(self) -> None:
        self._forward()

    def do_PUT(self) -> None:
        self._forward()

    def do_POST(self) -> None:
        self._forward()

    def do_DELETE(self) -> None:
        self._forward()

    def _forward(self) -> None:
        self.record()
        proxy = self.owner
        fault = proxy.take_fault(self.command, self.path, self.headers.get("Range"))
        if fault is not None and fault.kind == "status":
            text = f"injected {fault.status}".encode()
            self.send_response(fault.status)
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(text)
            return
        if fault is not None and fault.kind == "stall":
            while not fault.release.is_set():
                if proxy.stopping.is_set():
                    return
                if self._client_gone():
                    proxy.note_abandoned()
                    return
                fault.release.wait(0.05)
        if fault is not None and fault.kind == "delay":
            proxy.stopping.wait(fault.seconds)
        length = int(self.headers.get("Content-Length") or 0)
        payload = self.rfile.read(length) if length else None
        conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=30)
        try:
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for k, v in self.headers.items():
                conn.putheader(k, v)
            conn.endheaders(payload)
            resp = conn.getresponse()
            body = resp.read()
        finally:
            conn.close()
        headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP]
        if fault is not None and fault.kind == "short" and resp.status in (200, 206) and body:
            start = 0
            cr = resp.getheader("Content-Range")
            total = len(body)
            if cr is not None:
                m = re.match(r"bytes (\d+)-(\d+)/(\d+)", cr)
                assert m is not None
                start, total = int(m.group(1)), int(m.group(3))
            body = body[: max(1, len(body) // 2)]
            headers = [(k, v) for k, v in headers if k.lower() not in ("content-range",)]
            headers.append(("Content-Range", f"bytes {start}-{start + len(body) - 1}/{total}"))
            self._respond(206, headers, body, len(body))
            return
        if fault is not None and fault.kind == "drop" and self.command == "GET" and body:
            self._respond(resp.status, headers, body[: len(body) // 2], len(body))
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self._respond(resp.status, headers, body if self.command != "HEAD" else b"", None)

    def _client_gone(self) -> bool:
        readable, _, _ = select.select([self.connection], [], [], 0)
        if not readable:
            return False
        try:
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _respond(
        self,
        status: int,
        headers: list[tuple[str, str]],
        body: bytes,
        content_length: int | None,
    ) -> None:
        self.send_response(status)
        for k, v in headers:
            if k.lower() == "content-length" and content_length is not None:
                continue
            self.send_header(k, v)
        if content_length is not None:
            self.send_header("Content-Length", str(content_length))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()


_HOP = {"connection", "keep-alive", "transfer-encoding", "server", "date"}


class FaultProxy(_Base):
    """Forwards every request to 127.0.0.1:`upstream_port` unchanged (the
    Host header included, so signed S3 requests stay valid), except those a
    queued Fault matches."""

    handler = _ProxyHandler

    def __init__(self, upstream_port: int) -> None:
        super().__init__()
        self.upstream_port = upstream_port
        self._faults: list[Fault] = []
        self.abandoned = 0  # stalled requests whose client closed the connection

    def note_abandoned(self) -> None:
        with self._lock:
            self.abandoned += 1

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self._faults.append(fault)
        return fault

    def take_fault(self, method: str, path: str, range_header: str | None) -> Fault | None:
        start = None
        if range_header is not None:
            m = _RANGE.match(range_header.strip())
            if m is not None and m.group(1):
                start = int(m.group(1))
        with self._lock:
            for f in self._faults:
                if (
                    f.times > 0
                    and f.method == method
                    and f.path_contains in path
                    and (f.range_start is None or f.range_start == start)
                ):
                    f.times -= 1
                    f.hit.set()
                    return f
        return None

    def stop(self) -> None:
        with self._lock:
            for f in self._faults:
                f.release.set()
        super().stop()


def tls_pair() -> tuple[ssl.SSLContext, str]:
    """A server context for 127.0.0.1 whose certificate is signed by a fresh
    CA, and that CA's certificate (PEM) for the client to trust."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(days=1), now + datetime.timedelta(days=1)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "chute test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    # load_cert_chain reads files only: write them to a private temporary directory.
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        cert_path, key_path = Path(d) / "cert.pem", Path(d) / "key.pem"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        ctx.load_cert_chain(str(cert_path), str(key_path))
    return ctx, ca.public_bytes(serialization.Encoding.PEM).decode()


@dataclass
class S3:
    """A moto S3 server on 127.0.0.1 with dummy credentials."""

    endpoint: str
    port: int

    def storage_options(self, endpoint: str | None = None) -> dict[str, str]:
        return {
            "endpoint": endpoint or self.endpoint,
            "access_key_id": "testing",
            "secret_access_key": "testing",
            "region": "us-east-1",
        }

    def client(self) -> object:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )

    def bucket(self, name: str, objects: dict[str, bytes]) -> None:
        c = self.client()
        c.create_bucket(Bucket=name)  # type: ignore[attr-defined]
        for key, data in objects.items():
            c.put_object(Bucket=name, Key=key, Body=data)  # type: ignore[attr-defined]


@pytest.fixture
def object_server() -> Iterator[ObjectServer]:
    with ObjectServer() as server:
        assert isinstance(server, ObjectServer)
        yield server


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[S3]:
    pytest.importorskip("moto.server")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield S3(f"http://{host}:{port}", port)
    finally:
        server.stop()
