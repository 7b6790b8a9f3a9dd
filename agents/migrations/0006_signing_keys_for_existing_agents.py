"""Every agent gets its active signing key when it is created (agents.services.agent_create);
agents created before that, which got theirs lazily on a read, get one here. Idempotent: an
agent with an active key is left as it is. Reversing it removes nothing (keys may have signed
deliveries since)."""

import base64

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.db import migrations

from a2a_platform.lib import crypto


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def create_missing_keys(apps, schema_editor):
    Agent = apps.get_model("agents", "Agent")
    SigningKey = apps.get_model("agents", "SigningKey")
    keyed = SigningKey.objects.filter(state="active").values("agent_id")
    for agent in Agent.objects.exclude(pk__in=keyed).order_by("pk"):
        private = Ed25519PrivateKey.generate()
        raw_private = private.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )
        raw_public = private.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        SigningKey.objects.create(
            agent=agent,
            public_key=_b64url(raw_public),
            private_key_encrypted=crypto.encrypt(_b64url(raw_private)),
            state="active",
        )


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0005_heartbeat_cardversion"),
    ]

    operations = [
        migrations.RunPython(create_missing_keys, migrations.RunPython.noop),
    ]
