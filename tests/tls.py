"""TLS for the transport's https tests: a test certificate authority and a TLS HTTP receiver.

    ca = CertificateAuthority(tmp_path)                  # ca.cert_path: the PEM to trust
    leaf = ca.issue(tmp_path, dns=["receiver.test"])     # leaf.cert_path, leaf.key_path
    expired = ca.issue(tmp_path, dns=["receiver.test"], expired=True)
    stranger = CertificateAuthority(tmp_path, "Untrusted CA").issue(tmp_path, dns=[...])

    with TLSReceiver(leaf) as receiver:                  # 127.0.0.1, a port of its own
        post(receiver.url("receiver.test"), ...)
        receiver.requests, receiver.connections, receiver.handshakes, receiver.server_names

The receiver is a `ThreadingHTTPServer` on a thread, speaking HTTP/1.1 with keep-alive and
answering 200 to every POST. Each accepted TCP connection is counted before its handshake, and
the handshake runs on the connection's own thread (a client that never finishes it holds only
that thread). It records the SNI name each client sent (`sni_callback`; None when the client
sent none, as for an IP address), each handshake that completed and each that failed, and
every request it read.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

HOST = "127.0.0.1"
RESPONSE_BODY = b'{"ok":true}'


# --- certificates -------------------------------------------------------------------------


@dataclass(frozen=True)
class Leaf:
    """A server certificate and its key, as PEM files."""

    cert_path: Path
    key_path: Path


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class CertificateAuthority:
    """A self-signed CA (P-256) whose certificate is written to `directory`/<name>.ca.pem."""

    def __init__(self, directory: Path, name: str = "A2A Test CA") -> None:
        self.name = name
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = dt.datetime.now(dt.UTC)
        public = self.key.public_key()
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        self.cert_path = Path(directory) / f"{_slug(name)}.ca.pem"
        self.cert_path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self,
        directory: Path,
        *,
        dns: Iterable[str] = (),
        ips: Iterable[str] = (),
        expired: bool = False,
        label: str | None = None,
    ) -> Leaf:
        """A server certificate for `dns` names and `ips` (subjectAltName), signed by this CA,
        valid now (or, `expired`, until yesterday); written as <label>.pem and <label>.key."""
        dns, ips = list(dns), list(ips)
        assert dns or ips, "a certificate names at least one host"
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        if expired:
            not_before, not_after = now - dt.timedelta(days=30), now - dt.timedelta(days=1)
        else:
            not_before, not_after = now - dt.timedelta(days=1), now + dt.timedelta(days=30)
        names: list[x509.GeneralName] = [x509.DNSName(name) for name in dns]
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, (dns or ips)[0])]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )
        stem = _slug(label or f"{self.name} {(dns or ips)[0]}{' expired' if expired else ''}")
        leaf = Leaf(Path(directory) / f"{stem}.pem", Path(directory) / f"{stem}.key")
        leaf.cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        leaf.key_path.write_bytes(_key_pem(key))
        leaf.key_path.chmod(0o600)
        return leaf


def server_context(leaf: Leaf) -> ssl.SSLContext:
    """A server-side context presenting `leaf` (HTTP/1.1 only)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(leaf.cert_path, leaf.key_path)
    context.set_alpn_protocols(["http/1.1"])
    return context


# --- the receiver -------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive
    disable_nagle_algorithm = True

    def log_message(self, format, *args) -> None:  # noqa: A002
        pass

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        receiver = self.server.receiver
        with receiver.lock:
            receiver.requests.append(
                Request(self.command, self.path, list(self.headers.items()), body)
            )
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Receiver", "tls")
        self.send_header("Content-Length", str(len(RESPONSE_BODY)))
        self.end_headers()
        self.wfile.write(RESPONSE_BODY)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, receiver: TLSReceiver) -> None:
        self.receiver = receiver
        super().__init__((HOST, 0), _Handler)

    def verify_request(self, request, client_address) -> bool:
        with self.receiver.lock:
            self.receiver.connections += 1
        return True

    def finish_request(self, request, client_address) -> None:
        """On the connection's thread: the handshake, then HTTP over the TLS socket."""
        receiver = self.receiver
        request.settimeout(10)
        try:
            tls = receiver.context.wrap_socket(request, server_side=True)
        except OSError as exc:  # ssl.SSLError included
            with receiver.lock:
                receiver.failed_handshakes.append(f"{type(exc).__name__}: {exc}")
            return
        with receiver.lock:
            receiver.handshakes += 1
        try:
            self.RequestHandlerClass(tls, client_address, self)
        except OSError:
            pass  # the client went away mid-request
        finally:
            tls.close()


class TLSReceiver:
    """An https receiver on 127.0.0.1 presenting `leaf`; a context manager (start/stop)."""

    def __init__(self, leaf: Leaf) -> None:
        self.lock = threading.Lock()
        self.requests: list[Request] = []
        self.connections = 0  # accepted TCP connections
        self.handshakes = 0  # TLS handshakes that completed
        self.failed_handshakes: list[str] = []
        self.server_names: list[str | None] = []  # the SNI of each handshake's ClientHello
        self.context = server_context(leaf)
        self.context.sni_callback = self._sni
        self.server = _Server(self)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def _sni(self, sock, server_name: str | None, context) -> None:
        with self.lock:
            self.server_names.append(server_name)

    def url(self, host: str, path: str = "/hook") -> str:
        return f"https://{host}:{self.port}{path}"

    def wait_for(self, predicate: Callable[[TLSReceiver], bool], timeout: float = 10) -> None:
        """Until `predicate(self)` holds (the server's threads record after the client saw
        the outcome); AssertionError with what was recorded if it never does."""
        deadline = time.monotonic() + timeout
        while not predicate(self):
            if time.monotonic() > deadline:
                raise AssertionError(f"receiver state not reached: {self.summary()}")
            time.sleep(0.01)

    def summary(self) -> dict:
        with self.lock:
            return {
                "connections": self.connections,
                "handshakes": self.handshakes,
                "failed_handshakes": list(self.failed_handshakes),
                "server_names": list(self.server_names),
                "requests": [(r.method, r.path) for r in self.requests],
            }

    def start(self) -> TLSReceiver:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> TLSReceiver:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
