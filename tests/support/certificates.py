"""Throw-away certificate authorities and certificates for TLS tests (``openssl`` on PATH)."""

from __future__ import annotations

import subprocess
from pathlib import Path

Authority = tuple[Path, Path]


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _key(path: Path) -> Path:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", str(path))
    path.chmod(0o600)  # libpq-style clients refuse group/world-readable keys
    return path


def authority(directory: Path, name: str) -> Authority:
    """A self-signed CA: ``<name>.key`` and ``<name>.crt`` in ``directory``."""
    key = _key(directory / f"{name}.key")
    cert = directory / f"{name}.crt"
    _openssl("req", "-x509", "-new", "-key", str(key), "-days", "2", "-subj", f"/CN={name}", "-out", str(cert))
    return key, cert


def signed(directory: Path, name: str, common_name: str, issuer: Authority, *, server: bool) -> Path:
    """``<name>.crt``/``<name>.key`` for ``common_name`` signed by ``issuer``: a server certificate
    for 127.0.0.1, or a client certificate. Returns the certificate's path."""
    key = _key(directory / f"{name}.key")
    request, cert = directory / f"{name}.csr", directory / f"{name}.crt"
    _openssl("req", "-new", "-key", str(key), "-subj", f"/CN={common_name}", "-out", str(request))
    extensions = directory / f"{name}.ext"
    extensions.write_text("subjectAltName=IP:127.0.0.1\n" if server else "extendedKeyUsage=clientAuth\n")
    ca_key, ca_cert = issuer
    _openssl(
        "x509", "-req", "-in", str(request), "-CA", str(ca_cert), "-CAkey", str(ca_key), "-CAcreateserial",
        "-days", "2", "-extfile", str(extensions), "-out", str(cert),
    )  # fmt: skip
    return cert
