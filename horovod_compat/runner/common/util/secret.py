"""Shared secret used to authenticate the launcher's services to the ranks (HMAC-SHA256)."""

import hashlib
import hmac
import secrets

# The environment variable that carries the key to the ranks (never forwarded by horovodrun).
HOROVOD_SECRET_KEY = "_HOROVOD_SECRET_KEY"
SECRET_LENGTH = 32  # bytes
DIGEST_LENGTH = 32  # bytes of an HMAC-SHA256 digest


def make_secret_key() -> bytes:
    """A fresh random key of SECRET_LENGTH bytes."""
    return secrets.token_bytes(SECRET_LENGTH)


def compute_digest(key: bytes, message: bytes) -> bytes:
    """HMAC-SHA256 of ``message`` under ``key``."""
    return hmac.new(key, message, hashlib.sha256).digest()


def check_digest(key: bytes, message: bytes, digest: bytes) -> bool:
    """Whether ``digest`` authenticates ``message`` under ``key`` (constant-time compare)."""
    return hmac.compare_digest(compute_digest(key, message), digest)
