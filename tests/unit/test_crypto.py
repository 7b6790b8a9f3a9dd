"""Secrets at rest (a2a_platform.lib.crypto): round trip, key rotation, tampering, configuration."""

from __future__ import annotations

import base64

import pytest
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from a2a_platform.lib import crypto

OLD_KEY = Fernet.generate_key().decode()
NEW_KEY = Fernet.generate_key().decode()
SECRET = "whsk_super-secret-credential ✓"


def test_crypto_round_trip_with_a_configured_key():
    with override_settings(A2A_SECRETS_KEYS=[NEW_KEY]):
        token = crypto.encrypt(SECRET)
        assert SECRET not in token
        assert crypto.decrypt(token) == SECRET
        # Fernet tokens are randomized: the same secret never encrypts to the same text.
        assert crypto.encrypt(SECRET) != token


def test_crypto_round_trip_with_the_development_key():
    with override_settings(A2A_SECRETS_KEYS=[], PROFILE="development"):
        token = crypto.encrypt(SECRET)
        assert crypto.decrypt(token) == SECRET
        # Readable with the key derived from SECRET_KEY, so it is HKDF's output that is used.
        from django.conf import settings

        derived = Fernet(crypto.derive_development_key(settings.SECRET_KEY))
        assert derived.decrypt(token.encode()).decode() == SECRET


def test_crypto_development_key_depends_on_secret_key():
    a = crypto.derive_development_key("a" * 40)
    assert a == crypto.derive_development_key("a" * 40)
    assert a != crypto.derive_development_key("b" * 40)
    assert len(base64.urlsafe_b64decode(a)) == 32
    with override_settings(A2A_SECRETS_KEYS=[], SECRET_KEY="a" * 40):
        token = crypto.encrypt(SECRET)
    with (
        override_settings(A2A_SECRETS_KEYS=[], SECRET_KEY="b" * 40),
        pytest.raises(crypto.SecretDecryptionError),
    ):
        crypto.decrypt(token)


def test_crypto_rotation_with_two_keys():
    with override_settings(A2A_SECRETS_KEYS=[OLD_KEY]):
        old_token = crypto.encrypt(SECRET)

    # Step 1 of a rotation: the new key goes first, the old one stays for reading.
    with override_settings(A2A_SECRETS_KEYS=[NEW_KEY, OLD_KEY]):
        assert crypto.decrypt(old_token) == SECRET
        new_token = crypto.encrypt(SECRET)
        rotated = crypto.rotate(old_token)
        assert crypto.decrypt(rotated) == SECRET

    # Step 2: the old key is dropped; re-encrypted tokens still read, old ones do not.
    with override_settings(A2A_SECRETS_KEYS=[NEW_KEY]):
        assert crypto.decrypt(rotated) == SECRET
        assert crypto.decrypt(new_token) == SECRET
        with pytest.raises(crypto.SecretDecryptionError):
            crypto.decrypt(old_token)
    # The rotated token is made with the new key alone.
    assert Fernet(NEW_KEY.encode()).decrypt(rotated.encode()).decode() == SECRET


@pytest.mark.parametrize(
    "tamper",
    [
        lambda t: t[:-4] + ("AAAA" if t[-4:] != "AAAA" else "BBBB"),
        lambda t: t[:20] + ("x" if t[20] != "x" else "y") + t[21:],
        lambda t: t[:-10],
        lambda t: "not a token at all",
        lambda t: "",
        lambda t: "ünïcode",
    ],
)
def test_crypto_tampered_token_raises_a_clear_error(tamper):
    with override_settings(A2A_SECRETS_KEYS=[NEW_KEY]):
        token = crypto.encrypt(SECRET)
        bad = tamper(token)
        with pytest.raises(crypto.SecretDecryptionError, match="tampered") as info:
            crypto.decrypt(bad)
        assert SECRET not in str(info.value)
        if bad:
            assert bad not in str(info.value)
        with pytest.raises(crypto.SecretDecryptionError):
            crypto.rotate(bad)


def test_crypto_production_never_derives_a_key():
    with (
        override_settings(A2A_SECRETS_KEYS=[], PROFILE="production"),
        pytest.raises(ImproperlyConfigured, match="production"),
    ):
        crypto.encrypt(SECRET)


def test_crypto_invalid_configured_key_is_refused_without_echoing_it():
    with (
        override_settings(A2A_SECRETS_KEYS=[NEW_KEY, "not-a-fernet-key"]),
        pytest.raises(ImproperlyConfigured, match="entry 2") as info,
    ):
        crypto.encrypt(SECRET)
    assert "not-a-fernet-key" not in str(info.value)
