"""An operator's retirement of an agent's signing key from the console (issue 16).

agents.signing.signing_key_retire retires a `retiring` key (never the active one); here it is
refused, too, for a key an open rebind still relies on (its old key keeps signing until the
drain ends, its new key is about to sign: DESIGN.md invariant 3, drain), and audited. A key
rotation is a rebind (webhooks/rebinds/operations.py's rebind_start, through the wizard), never a
bare key swap from the agent's page.
"""

from __future__ import annotations

from django.db.models import Q

from agents.models import SigningKey
from agents.signing import SigningKeyError, signing_key_retire
from webhooks.models import OPEN_REBIND_STATES, Rebind


def signing_key_retire_checked(*, key_pk: int, actor: str) -> SigningKey:
    """Retire the key unless an open rebind uses it; audited as `retire_signing_key` in the
    retirement's own transaction (`agents.signing.signing_key_retire`).
    Raises SigningKeyError (the active key, or in use by an open rebind) and
    SigningKey.DoesNotExist. The check reads before the retirement's own transaction
    (agents.signing's, the outermost): a rebind started in between keeps its key only if
    it rotates away from it, which makes a new active key and leaves this one retiring."""
    key = SigningKey.objects.get(pk=key_pk)
    in_use_by = (
        Rebind.objects.filter(Q(old_key_id=key_pk) | Q(new_key_id=key_pk))
        .filter(state__in=OPEN_REBIND_STATES)
        .first()
    )
    if in_use_by is not None:
        raise SigningKeyError(
            f"key {key.kid} is in use by open rebind {in_use_by.pk} ({in_use_by.state}): it "
            "retires when that rebind ends"
        )
    return signing_key_retire(key_id=key_pk, actor=actor)
