"""Secrets at rest: webhook credentials and private keys, encrypted with Fernet.

Keys come from `A2A_SECRETS_KEYS` (comma-separated Fernet keys, newest first). Encryption
always uses the newest key; decryption tries every key, so an operator rotates by putting a
new key in front, running `rotate()` over the stored tokens, and only then dropping the old
key from the list.

When the list is empty outside production, one key is derived from SECRET_KEY with HKDF, so
`make run` and the tests work on a bare machine. That key is **for development only**: it
changes when SECRET_KEY changes (making every stored secret unreadable), and anyone with
SECRET_KEY can read the secrets. Production refuses to start without A2A_SECRETS_KEYS
(settings.py); `_fernet()` refuses too, in case settings were assembled some other way.

Settings are read on first use, never at import time.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import secrets

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

# Domain separation: this derived key must never equal a key derived from SECRET_KEY for
# another purpose.
_HKDF_SALT = b"a2a-platform/secrets-at-rest"
_HKDF_INFO = b"fernet-key/v1/development-only"


class SecretDecryptionError(Exception):
    """A stored secret could not be decrypted.

    The token was altered, is not a Fernet token, or was encrypted with a key that is no
    longer in A2A_SECRETS_KEYS. The message never contains the token or a key.
    """


def derive_development_key(secret_key: str) -> bytes:
    """The Fernet key used when A2A_SECRETS_KEYS is empty (development and tests only)."""
    raw = HKDF(algorithm=hashes.SHA256(), length=32, salt=_HKDF_SALT, info=_HKDF_INFO).derive(
        secret_key.encode()
    )
    return base64.urlsafe_b64encode(raw)


@functools.lru_cache(maxsize=8)
def _build(keys: tuple[str, ...], secret_key: str, profile: str) -> MultiFernet:
    if not keys:
        if profile == "production":
            raise ImproperlyConfigured(
                "A2A_SECRETS_KEYS is empty: production never derives the secrets key"
            )
        return MultiFernet([Fernet(derive_development_key(secret_key))])
    fernets = []
    for position, key in enumerate(keys, start=1):
        try:
            fernets.append(Fernet(key.strip().encode()))
        except (ValueError, TypeError):
            # The key itself is never echoed.
            raise ImproperlyConfigured(
                f"A2A_SECRETS_KEYS entry {position} is not a Fernet key "
                "(32 url-safe base64-encoded bytes)"
            ) from None
    return MultiFernet(fernets)


def _fernet() -> MultiFernet:
    # Cached on the settings values, so override_settings in tests takes effect.
    keys = tuple(k for k in settings.A2A_SECRETS_KEYS if k.strip())
    return _build(keys, settings.SECRET_KEY, settings.PROFILE)


def encrypt(text: str) -> str:
    """Encrypt `text` with the newest key; the token is URL-safe ASCII."""
    return _fernet().encrypt(text.encode()).decode("ascii")


def decrypt(token: str) -> str:
    """Decrypt a token made by `encrypt` with any configured key."""
    try:
        return _fernet().decrypt(token.encode("ascii")).decode()
    except (InvalidToken, UnicodeError):
        raise SecretDecryptionError(
            "secret could not be decrypted: the token is corrupted or tampered with, or its "
            "key is no longer in A2A_SECRETS_KEYS"
        ) from None


def rotate(token: str) -> str:
    """Re-encrypt a token with the newest key (the plaintext never leaves this function)."""
    try:
        return _fernet().rotate(token.encode("ascii")).decode("ascii")
    except (InvalidToken, UnicodeError):
        raise SecretDecryptionError(
            "secret could not be re-encrypted: the token is corrupted or tampered with, or its "
            "key is no longer in A2A_SECRETS_KEYS"
        ) from None


# --- Bearer secrets stored as digests (A2A API keys, management API tokens) ----------------
# `<label>_<prefix>_<secret>`: a random 256-bit secret; only its SHA-256 digest is stored and
# the public 12-character prefix finds the row (an index hit, not a scan or a slow hash).
TOKEN_PREFIX_LENGTH = 12


def token_new(label: str) -> tuple[str, str]:
    """A new bearer token `<label>_<prefix>_<secret>`: returns (prefix, token)."""
    prefix = secrets.token_hex(TOKEN_PREFIX_LENGTH // 2)
    return prefix, f"{label}_{prefix}_{secrets.token_urlsafe(32)}"


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_prefix(token: str, label: str) -> str | None:
    """The prefix of a token shaped `<label>_<prefix>_<secret>`, or None for any other shape."""
    # The secret is token_urlsafe, whose alphabet includes "_": split off the prefix only.
    parts = token.split("_", 2)
    if len(parts) != 3 or parts[0] != label or len(parts[1]) != TOKEN_PREFIX_LENGTH:
        return None
    return parts[1]


def token_matches(digest: str, token: str) -> bool:
    """Constant-time comparison of a stored digest with a presented token's."""
    return hmac.compare_digest(digest, token_digest(token))
