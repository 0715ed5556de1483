"""A crawl's own certificate authority, so that the policy proxy can read what is inside https and wss.

The proxy ends the browser's TLS itself (policy_proxy.py) with a certificate for the host the
browser asked for, signed here, and opens its own TLS connection to the real server, which it
verifies. Each Renderer makes its own authority at start: a key pair that lives in memory and in
a private folder (mode 0700) removed when the renderer closes; nothing is installed in the system
or in a browser profile that outlives the run. The browser trusts it through one flag,
`--ignore-certificate-errors-spki-list` with the hash of the leaf key all certificates here share
(`spki`), which Chromium honours for the profile it is started with.

Upstream, the proxy verifies the server the way a browser would refuse it: an untrusted chain
(system roots, plus `extra_roots`, the PEM text of a private PKI's CA certificates), a name or
address the certificate does not cover, an expired or not yet valid certificate, TLS below 1.2.
There is no option to skip verification: a page whose server fails it fails with the reason.
"""
from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import os
import shutil
import ssl
import tempfile
import threading

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# the browser trusts the key (its SPKI hash), not the dates; a crawl's worker may run for weeks,
# and a host's certificate, made once, serves it all that time
VALID = datetime.timedelta(days=3650)
ALPN = ["http/1.1"]                          # the proxy reads HTTP/1.1 inside the tunnel, both ways
SPKI_FLAG = "--ignore-certificate-errors-spki-list"


def check_roots(pem: str) -> str:
    """`pem` if it holds at least one CA certificate OpenSSL reads; ValueError saying what is wrong."""
    if "-----BEGIN CERTIFICATE-----" not in pem:
        raise ValueError("extra TLS roots: no PEM certificate (-----BEGIN CERTIFICATE-----) in the text")
    try:
        ssl.create_default_context().load_verify_locations(cadata=pem)
    except ssl.SSLError as e:
        raise ValueError(f"extra TLS roots: not a PEM bundle of CA certificates ({e.reason or e})") from None
    return pem


class TlsAuthority:
    """Leaf certificates per host, signed by a key made for this crawl; `client_context()` the
    upstream side's verifying context."""

    def __init__(self, extra_roots: str | None = None):
        """extra_roots: PEM text of CA certificates trusted besides the system's (the text, not a
        path: it travels with the settings to workers that share no disk)."""
        if extra_roots is not None:
            check_roots(extra_roots)
        self.extra_roots = extra_roots
        self._folder = tempfile.mkdtemp(prefix="shardsmith-tls-")     # 0700, as mkdtemp makes it
        self._lock = threading.Lock()
        self._contexts: dict[str, ssl.SSLContext] = {}
        self._client: ssl.SSLContext | None = None
        self._ca_key = ec.generate_private_key(ec.SECP256R1())
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "shardsmith crawl authority")])
        self._ca_name, self._now = name, now
        self._ca = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                    .public_key(self._ca_key.public_key()).serial_number(x509.random_serial_number())
                    .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + VALID)
                    .add_extension(x509.BasicConstraints(ca=True, path_length=0), True)
                    .sign(self._ca_key, hashes.SHA256()))
        self._key_path = os.path.join(self._folder, "leaf.key")
        with open(os.open(self._key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as fh:
            fh.write(self._key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption()))
        der = self._key.public_key().public_bytes(serialization.Encoding.DER,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo)
        self.spki = base64.b64encode(hashlib.sha256(der).digest()).decode()

    @property
    def ca_pem(self) -> bytes:
        """The authority's certificate: what a client other than the browser trusts to talk through the proxy."""
        return self._ca.public_bytes(serialization.Encoding.PEM)

    @property
    def browser_flag(self) -> str:
        """The Chromium flag that makes the browser trust this authority's certificates, and no other's."""
        return f"{SPKI_FLAG}={self.spki}"

    def trusted_by(self, args) -> tuple[str, ...]:
        """Chromium's `args` with this authority trusted: added to an SPKI list already there (Chromium
        reads one such flag, the last), else as a flag of its own."""
        given = [a for a in args if a.startswith(SPKI_FLAG + "=")]
        rest = tuple(a for a in args if not a.startswith(SPKI_FLAG + "="))
        listed = [h for a in given for h in a.split("=", 1)[1].split(",") if h]
        return (*rest, f"{SPKI_FLAG}={','.join([*listed, self.spki])}")

    def server_context(self, host: str) -> ssl.SSLContext:
        """The context that answers the browser's handshake for `host` (a name or an address)."""
        with self._lock:
            context = self._contexts.get(host)
            if context is None:
                context = self._contexts[host] = self._make_context(host)
            return context

    def client_context(self) -> ssl.SSLContext:
        """The upstream side: the system's roots (and extra_roots), hostname checked, TLS 1.2 or later.
        Made once: loading the system's roots costs about 30 ms, and every https request of a page
        is a tunnel of its own (an SSLContext serves many threads)."""
        with self._lock:
            if self._client is None:
                context = ssl.create_default_context()
                if self.extra_roots:
                    context.load_verify_locations(cadata=self.extra_roots)
                context.minimum_version = ssl.TLSVersion.TLSv1_2
                context.set_alpn_protocols(ALPN)
                self._client = context
            return self._client

    def close(self) -> None:
        shutil.rmtree(self._folder, ignore_errors=True)

    def __enter__(self) -> TlsAuthority:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _make_context(self, host: str) -> ssl.SSLContext:
        try:
            alt: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host.strip("[]")))
        except ValueError:
            alt = x509.DNSName(host)
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64] or "-")]))
                .issuer_name(self._ca_name).public_key(self._key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(self._now - datetime.timedelta(hours=1)).not_valid_after(self._now + VALID)
                .add_extension(x509.SubjectAlternativeName([alt]), False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
                .sign(self._ca_key, hashes.SHA256()))
        chain = os.path.join(self._folder, hashlib.sha256(host.encode()).hexdigest()[:16] + ".pem")
        with open(chain, "wb") as fh:
            fh.write(cert.public_bytes(serialization.Encoding.PEM) + self._ca.public_bytes(serialization.Encoding.PEM))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(chain, self._key_path)
        context.set_alpn_protocols(ALPN)
        return context
