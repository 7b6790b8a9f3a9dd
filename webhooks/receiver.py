"""Receiver side: verify push deliveries from this platform (for A2A clients and our tests).

Standalone on purpose: no Django. It needs `cryptography` and `PyJWT`, and `httpx` only when
it fetches the JWKS itself. See docs/webhooks-receiving.md.

    verifier = WebhookVerifier(jwks_url="https://agents.example.com/.well-known/jwks.json")
    channels = ChannelTrust()           # optional: per-task channel trust across rebinds
    ledger = DeliveryLedger()

    delivery = verifier.verify(
        request_headers, raw_body, expected_audience=MY_WEBHOOK_URL, channels=channels
    )
    if not ledger.accept(delivery):
        return 200                      # a redelivery of an event already handled
    if ledger.is_stale(delivery.task_id, delivery.seq):
        return 200                      # older than an update already applied
    handle(delivery.payload)

What is checked, in this order (a failure raises `VerificationError(reason)`):

1. `webhook-id`, `webhook-timestamp`, `webhook-signature` are present ("headers").
2. `webhook-timestamp` is within ±tolerance of now ("stale").
3. One `v1a` (Ed25519) entry of `webhook-signature` verifies over
   `{webhook-id}.{webhook-timestamp}.{body}` with a key of the trusted JWKS ("signature").
   `v1a` carries no kid, so every key is tried (the `X-A2A-Signature-Key-Ids` hint orders
   them); when none verifies, the JWKS is fetched again once, at most every
   `min_refresh_seconds` — this is how a receiver learns a rotated-in key.
4. `Authorization: Bearer <JWT>`, when present: EdDSA, kid in the JWKS, exp/iat, aud (when
   `expected_audience` is given), jti == webhook-id, bodySha256 == base64url(SHA-256(body)),
   and taskId / seq / bindingVersion claims agree with the headers and body ("jwt").
5. `X-A2A-Notification-Token` == `expected_token`, when given ("token").
6. The body is a JSON object ("payload").

7. With `channels=ChannelTrust()`: the delivery's binding version and the kid whose signature
   verified belong to a channel its task trusts ("channel", raised as `ChannelError`). A
   task's first delivery is trusted on first use; a verified push-channel notice on a trusted
   channel teaches the task its next channel (see `ChannelTrust`).

`X-A2A-Task-Seq` and `X-A2A-Binding-Version` are not covered by the Standard Webhooks
signature; they are trustworthy when the JWT carries them too (checked in step 4) or the
transport is TLS to your own endpoint.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jwt
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

HEADER_ID = "webhook-id"
HEADER_TIMESTAMP = "webhook-timestamp"
HEADER_SIGNATURE = "webhook-signature"
HEADER_KEY_IDS = "x-a2a-signature-key-ids"
HEADER_TASK_ID = "x-a2a-task-id"
HEADER_TASK_SEQ = "x-a2a-task-seq"
HEADER_BINDING_VERSION = "x-a2a-binding-version"
HEADER_NOTIFICATION_TOKEN = "x-a2a-notification-token"
HEADER_AUTHORIZATION = "authorization"

SCHEME = "v1a"
ED25519_SIGNATURE_BYTES = 64

# The A2A extension whose metadata entry carries a rebind's channel notice (docs/
# webhooks-receiving.md, "Rebinds"). The platform uses this exact string.
PUSH_CHANNEL_EXTENSION_URI = "urn:a2a-platform:ext:push-channel:v1"
NOTICE_CHANNEL_CHANGED = "channel-changed"
NOTICE_CHANNEL_ORPHANED = "channel-orphaned"
NOTICE_KINDS = frozenset({NOTICE_CHANNEL_CHANGED, NOTICE_CHANNEL_ORPHANED})
# A channel's key ids are the agent's live keys, one to three in practice; the cap bounds what
# a notice (or a long run of rotations) can make a receiver store.
MAX_CHANNEL_KEY_IDS = 16

JwksFetcher = Callable[[str], Mapping[str, Any]]

logger = logging.getLogger(__name__)


# The console's test event (webhooks/console/endpoint_probe.py) carries its marker under
# this key of its status update's metadata, and goes with `X-A2A-Event-Kind: test`.
TEST_EVENT_URI = "urn:a2a-platform:ext:test-event:v1"


class VerificationError(Exception):
    """A delivery failed verification. `reason` is one of: headers, stale, signature, jwt,
    token, payload, jwks, channel. Answer the sender with a 4xx (401 for signature/jwt/token,
    403 for channel)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class VerifiedDelivery:
    event_id: str
    task_id: str | None
    seq: int | None
    binding_version: str | None
    timestamp: int
    payload: dict[str, Any] = field(compare=False)
    key_id: str | None = None  # kid of the key whose signature verified
    jwt_claims: dict[str, Any] | None = field(default=None, compare=False)

    @property
    def is_test(self) -> bool:
        """An operator's test send from the console (docs/webhooks-receiving.md, "Test
        events"): signed as any delivery, about no task (a task id of its own, never sent
        again), its marker under TEST_EVENT_URI in the signed body. Answer it 2xx and apply
        nothing."""
        update = self.payload.get("statusUpdate")
        metadata = update.get("metadata") if isinstance(update, Mapping) else None
        return isinstance(metadata, Mapping) and TEST_EVENT_URI in metadata


@dataclass(frozen=True)
class Channel:
    """One push channel of a task: the binding version deliveries carry
    (`X-A2A-Binding-Version`, `<configId>.v<n>`) and the kids of the keys that sign under it.
    `origin` and `path_prefix` are where it delivers, when a notice said so."""

    version: str
    key_ids: tuple[str, ...]
    origin: str | None = None
    path_prefix: str | None = None

    def __str__(self) -> str:
        where = f" at {self.origin}{self.path_prefix or ''}" if self.origin else ""
        return f"{self.version} [{', '.join(self.key_ids)}]{where}"


@dataclass(frozen=True)
class ChannelNotice:
    """A rebind's push-channel notice, read from a delivery by `parse_channel_notice`.

    `kind` is `channel-changed` (later deliveries, from `from_seq` on, come on `new_channel`)
    or `channel-orphaned` (cutover: no channel delivers this task any more; `new_channel` is
    None). It arrives on `old_channel`."""

    kind: str
    task_id: str | None
    rebind_id: str
    policy: str  # drain | cutover
    old_channel: Channel
    new_channel: Channel | None
    from_seq: int | None
    jwks_url: str | None


class ChannelError(VerificationError):
    """An authentic delivery (signature, JWT and token verified) on a channel its task does
    not trust, or one `ChannelTrust` cannot judge (no task id, no binding version). Names the
    task, what was offered (`offered_version`; `key_id`, the kid whose signature verified;
    `offered_key_ids`, the `X-A2A-Signature-Key-Ids` hint as sent) and what the task trusts
    (`trusted`, oldest first). `delivery` is the verified delivery, for logging."""

    def __init__(
        self,
        why: str,
        *,
        task_id: str | None,
        offered_version: str | None,
        key_id: str | None,
        offered_key_ids: tuple[str, ...] = (),
        trusted: tuple[Channel, ...] = (),
        orphaned: bool = False,
        delivery: VerifiedDelivery | None = None,
    ) -> None:
        offered = f"version {offered_version or '(none)'} signed by {key_id or '(no kid)'}"
        if offered_key_ids:
            offered += f" (offered kids {' '.join(offered_key_ids)})"
        trusts = "; ".join(str(channel) for channel in trusted) or "nothing"
        state = " (orphaned)" if orphaned else ""
        super().__init__(
            "channel",
            f"task {task_id or '(unknown)'}{state}: {why}; offered {offered}; trusts {trusts}",
        )
        self.why = why
        self.task_id = task_id
        self.offered_version = offered_version
        self.key_id = key_id
        self.offered_key_ids = offered_key_ids
        self.trusted = trusted
        self.orphaned = orphaned
        self.delivery = delivery


def _b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _body_sha256(body: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode("ascii")


def parse_jwks(jwks: Mapping[str, Any]) -> dict[str, Ed25519PublicKey]:
    """The Ed25519 signing keys of a JWKS by kid; other or malformed entries are skipped."""
    keys: dict[str, Ed25519PublicKey] = {}
    entries = jwks.get("keys") if isinstance(jwks, Mapping) else None
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, Mapping):
            continue
        if entry.get("kty") != "OKP" or entry.get("crv") != "Ed25519":
            continue
        if entry.get("alg", "EdDSA") != "EdDSA" or entry.get("use", "sig") != "sig":
            continue
        kid, x = entry.get("kid"), entry.get("x")
        if not isinstance(kid, str) or not kid or not isinstance(x, str):
            continue
        try:
            raw = _b64url_decode(x)
            keys[kid] = Ed25519PublicKey.from_public_bytes(raw)
        except ValueError:
            continue
    return keys


def _http_fetch(url: str) -> Mapping[str, Any]:
    import httpx  # only needed when the verifier fetches the JWKS itself

    response = httpx.get(url, timeout=10.0, follow_redirects=False)
    response.raise_for_status()
    return response.json()


def _task_id_from_body(payload: Mapping[str, Any]) -> str | None:
    """The task a StreamResponse is about: statusUpdate / artifactUpdate / message taskId,
    or task.id."""
    for name in ("statusUpdate", "artifactUpdate", "message"):
        part = payload.get(name)
        if isinstance(part, Mapping) and isinstance(part.get("taskId"), str):
            return part["taskId"]
    task = payload.get("task")
    if isinstance(task, Mapping) and isinstance(task.get("id"), str):
        return task["id"]
    return None


def _notice_error(detail: str) -> VerificationError:
    return VerificationError("payload", f"push-channel notice: {detail}")


def _notice_str(entry: Mapping[str, Any], name: str, where: str, *, optional: bool = False) -> Any:
    value = entry.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise _notice_error(f"{where}{name} must be a non-empty string")
    return value


def _notice_channel(entry: Any, where: str, *, new: bool) -> Channel:
    if not isinstance(entry, Mapping):
        raise _notice_error(f"{where} must be an object")
    key_ids = entry.get("keyIds")
    if (
        not isinstance(key_ids, list)
        or not all(isinstance(kid, str) and kid for kid in key_ids)
        or len(key_ids) > MAX_CHANNEL_KEY_IDS
    ):
        raise _notice_error(
            f"{where}.keyIds must be a list of at most {MAX_CHANNEL_KEY_IDS} non-empty strings"
        )
    return Channel(
        version=_notice_str(entry, "version", f"{where}."),
        key_ids=tuple(dict.fromkeys(key_ids)),
        origin=_notice_str(entry, "origin", f"{where}.") if new else None,
        path_prefix=_notice_str(entry, "pathPrefix", f"{where}.") if new else None,
    )


def parse_channel_notice(delivery: VerifiedDelivery) -> ChannelNotice | None:
    """The push-channel notice a verified delivery carries, or None when it carries none.

    A notice is a `statusUpdate` whose `metadata` has a `PUSH_CHANNEL_EXTENSION_URI` entry. A
    notice kind this module does not know is None too (an ordinary status update to it);
    a known kind with a missing or mistyped field raises `VerificationError("payload")`."""
    update = delivery.payload.get("statusUpdate")
    metadata = update.get("metadata") if isinstance(update, Mapping) else None
    if not isinstance(metadata, Mapping) or PUSH_CHANNEL_EXTENSION_URI not in metadata:
        return None
    entry = metadata[PUSH_CHANNEL_EXTENSION_URI]
    if not isinstance(entry, Mapping):
        raise _notice_error("the extension's metadata must be an object")
    kind = _notice_str(entry, "notice", "")
    if kind not in NOTICE_KINDS:
        return None
    changed = kind == NOTICE_CHANNEL_CHANGED
    from_seq = entry.get("fromSeq")
    if (from_seq is not None or changed) and (
        isinstance(from_seq, bool) or not isinstance(from_seq, int) or from_seq < 0
    ):
        raise _notice_error("fromSeq must be a non-negative integer")
    return ChannelNotice(
        kind=kind,
        task_id=delivery.task_id,
        rebind_id=_notice_str(entry, "rebindId", ""),
        policy=_notice_str(entry, "policy", ""),
        old_channel=_notice_channel(entry.get("oldChannel"), "oldChannel", new=False),
        new_channel=(
            _notice_channel(entry.get("newChannel"), "newChannel", new=True) if changed else None
        ),
        from_seq=from_seq,
        jwks_url=_notice_str(entry, "jwksUrl", "", optional=True),
    )


class WebhookVerifier:
    """Verifies deliveries against a trusted JWKS (given, fetched from `jwks_url`, or both:
    the given set is used until the first refresh). Thread-safe."""

    def __init__(
        self,
        jwks_url: str | None = None,
        jwks: Mapping[str, Any] | None = None,
        tolerance_seconds: int = 300,
        fetch: JwksFetcher | None = None,
        *,
        min_refresh_seconds: float = 60.0,
        jwt_leeway_seconds: int = 30,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if jwks_url is None and jwks is None:
            raise ValueError("give jwks_url, jwks, or both")
        self.jwks_url = jwks_url
        self.tolerance_seconds = tolerance_seconds
        self.min_refresh_seconds = min_refresh_seconds
        self.jwt_leeway_seconds = jwt_leeway_seconds
        self._fetch = fetch or _http_fetch
        self._clock = clock  # judges webhook-timestamp and JWT times
        self._monotonic = monotonic  # spaces JWKS refreshes
        self._lock = threading.Lock()
        self._keys: dict[str, Ed25519PublicKey] = parse_jwks(jwks) if jwks is not None else {}
        self._last_fetch: float | None = None  # monotonic time of the last fetch attempt

    # --- JWKS ----------------------------------------------------------------------------

    @property
    def key_ids(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._keys)

    def refresh(self, *, force: bool = False) -> bool:
        """Fetch the JWKS again, at most once per `min_refresh_seconds` unless forced.
        True when a fetch succeeded (the trusted set is then exactly what it returned)."""
        if self.jwks_url is None:
            return False
        with self._lock:
            now = self._monotonic()
            if (
                not force
                and self._last_fetch is not None
                and now - self._last_fetch < self.min_refresh_seconds
            ):
                return False
            self._last_fetch = now
            # The lock is kept across the fetch on purpose: concurrent verifications that all
            # miss wait for one fetch instead of each starting their own.
            try:
                keys = parse_jwks(self._fetch(self.jwks_url))
            except Exception as exc:
                if not self._keys:
                    raise VerificationError("jwks", f"could not fetch the JWKS: {exc}") from exc
                return False  # keep the keys we have; the next refresh may succeed
            if not keys and self._keys:
                # An answer with no usable key (an error page, a broken proxy) is not a
                # revocation of every key: keep trusting the last good set.
                return False
            self._keys = keys
            return True

    def _snapshot(self) -> dict[str, Ed25519PublicKey]:
        with self._lock:
            keys, never_fetched = dict(self._keys), self._last_fetch is None
        if not keys and self.jwks_url is not None:
            self.refresh(force=never_fetched)
            with self._lock:
                keys = dict(self._keys)
        if not keys:
            raise VerificationError("jwks", "no trusted Ed25519 key (JWKS empty or unreachable)")
        return keys

    # --- verification --------------------------------------------------------------------

    def verify(
        self,
        headers: Mapping[str, str],
        body: bytes,
        *,
        expected_audience: str | None = None,
        expected_token: str | None = None,
        expected_issuer: str | None = None,
        channels: ChannelTrust | None = None,
    ) -> VerifiedDelivery:
        """Verify one delivery (steps 1-6 of the module docstring); with `channels`, also
        check and learn its task's channel (step 7, `ChannelError`)."""
        h = {str(k).lower(): str(v) for k, v in headers.items()}
        msg_id = h.get(HEADER_ID, "").strip()
        raw_ts = h.get(HEADER_TIMESTAMP, "").strip()
        raw_sigs = h.get(HEADER_SIGNATURE, "").strip()
        if not msg_id or not raw_ts or not raw_sigs:
            raise VerificationError(
                "headers", "webhook-id, webhook-timestamp and webhook-signature are required"
            )
        if not raw_ts.isdigit():
            raise VerificationError("headers", "webhook-timestamp is not Unix seconds")
        timestamp = int(raw_ts)
        if abs(self._clock() - timestamp) > self.tolerance_seconds:
            raise VerificationError("stale", "webhook-timestamp is outside the tolerance")

        early: Any = None
        pinned: dict[str, Ed25519PublicKey] = {}
        prefer: tuple[str, ...] = ()
        if channels is not None:
            # Read (not trusted) before the signature check, so the task's own pinned keys are
            # tried first and a task whose keys left the JWKS still verifies.
            try:
                early = json.loads(body)
            except ValueError:
                early = None
            hint = _task_id_from_body(early) if isinstance(early, dict) else None
            hint = hint or h.get(HEADER_TASK_ID) or None
            if hint is not None:
                pinned, prefer = channels._keys_of(hint, h.get(HEADER_BINDING_VERSION) or None)
        key_id, key = self._verify_signature(h, msg_id, raw_ts, raw_sigs, body, pinned, prefer)

        seq = self._parse_seq(h.get(HEADER_TASK_SEQ))
        binding_version = h.get(HEADER_BINDING_VERSION) or None
        if isinstance(early, dict):
            payload = early
        else:
            try:
                payload = json.loads(body)
            except ValueError:
                raise VerificationError("payload", "the body is not JSON") from None
            if not isinstance(payload, dict):
                raise VerificationError("payload", "the body is not a JSON object")

        # The body is signed, the X-A2A-Task-Id header is not: the body wins, and a header
        # that disagrees with it is refused.
        task_id = _task_id_from_body(payload)
        header_task_id = h.get(HEADER_TASK_ID) or None
        if task_id is None:
            task_id = header_task_id
        elif header_task_id is not None and header_task_id != task_id:
            raise VerificationError("headers", "X-A2A-Task-Id does not match the body")

        claims = None
        authorization = h.get(HEADER_AUTHORIZATION, "")
        scheme, _, credentials = authorization.strip().partition(" ")
        credentials = credentials.strip()
        # A Bearer value shaped like a JWT is ours to verify; an opaque Bearer token is a
        # credential the client registered itself, left to the application to compare.
        if scheme.lower() == "bearer" and credentials.count(".") == 2:
            claims = self._verify_jwt(credentials, body, msg_id, expected_audience, expected_issuer)
            if task_id is not None and claims["taskId"] != task_id:
                raise VerificationError("jwt", "taskId does not match the delivery")
            task_id = task_id or claims["taskId"]
            if "seq" in claims:
                if isinstance(claims["seq"], bool) or not isinstance(claims["seq"], int):
                    raise VerificationError("jwt", "seq claim is not an integer")
                if seq is not None and seq != claims["seq"]:
                    raise VerificationError("jwt", "seq does not match X-A2A-Task-Seq")
                seq = claims["seq"]
            if "bindingVersion" in claims:
                if binding_version is not None and binding_version != str(claims["bindingVersion"]):
                    raise VerificationError(
                        "jwt", "bindingVersion does not match X-A2A-Binding-Version"
                    )
                binding_version = str(claims["bindingVersion"])

        if expected_token is not None:
            token = h.get(HEADER_NOTIFICATION_TOKEN)
            if token is None or not hmac.compare_digest(token.encode(), expected_token.encode()):
                raise VerificationError("token", "X-A2A-Notification-Token does not match")

        delivery = VerifiedDelivery(
            event_id=msg_id,
            task_id=task_id,
            seq=seq,
            binding_version=binding_version,
            timestamp=timestamp,
            payload=payload,
            key_id=key_id,
            jwt_claims=claims,
        )
        # A test event is about no task: no channel of any task is learnt from it.
        if channels is not None and not delivery.is_test:
            offered = tuple(h.get(HEADER_KEY_IDS, "").split())
            channels._admit(self, delivery, key, offered)
        return delivery

    @staticmethod
    def _parse_seq(raw: str | None) -> int | None:
        if raw is None or raw.strip() == "":
            return None
        if not raw.strip().isdigit():
            raise VerificationError("headers", "X-A2A-Task-Seq is not a non-negative integer")
        return int(raw.strip())

    def _verify_signature(
        self,
        h: Mapping[str, str],
        msg_id: str,
        raw_ts: str,
        raw_sigs: str,
        body: bytes,
        pinned: Mapping[str, Ed25519PublicKey],
        prefer: tuple[str, ...],
    ) -> tuple[str, Ed25519PublicKey]:
        signed = f"{msg_id}.{raw_ts}.".encode() + body
        signatures: list[bytes] = []
        for entry in raw_sigs.split():
            scheme, _, value = entry.partition(",")
            if scheme != SCHEME:
                continue  # v1 (HMAC) or a future scheme: not ours to check
            try:
                raw = base64.b64decode(value, validate=True)
            except ValueError:
                continue
            if len(raw) == ED25519_SIGNATURE_BYTES:
                signatures.append(raw)
        if not signatures:
            raise VerificationError("signature", "no v1a signature in webhook-signature")
        hints = h.get(HEADER_KEY_IDS, "").split()

        # A task's pinned key answers for its kid: the JWKS is not consulted for it, so a kid
        # re-published there with other bytes does not sign for that task.
        kid = self._match(pinned, signatures, hints, signed) if pinned else None
        if kid is not None:
            return kid, pinned[kid]

        def match() -> tuple[str, Ed25519PublicKey] | None:
            keys = {k: v for k, v in self._snapshot().items() if k not in pinned}
            found = self._match(keys, signatures, [*prefer, *hints], signed)
            return None if found is None else (found, keys[found])

        hit = match()
        if hit is None and self.refresh():
            hit = match()
        if hit is None:
            raise VerificationError("signature", "no signature verifies with a trusted key")
        return hit

    @staticmethod
    def _match(
        keys: Mapping[str, Ed25519PublicKey],
        signatures: list[bytes],
        hints: list[str],
        signed: bytes,
    ) -> str | None:
        # Hinted kids first (the sender lists them in signature order), then every key.
        order = [k for k in dict.fromkeys(hints) if k in keys]
        order += [k for k in keys if k not in hints]
        for kid in order:
            for signature in signatures:
                try:
                    keys[kid].verify(signature, signed)
                except InvalidSignature:
                    continue
                return kid
        return None

    def _public_keys(self, kids: Iterable[str]) -> dict[str, Ed25519PublicKey]:
        """The JWKS keys of `kids` this verifier holds, refreshing once (rate-limited) when
        one is missing: how a notice's new kid gets its public bytes."""
        wanted = set(kids)
        if not wanted:
            return {}
        try:
            keys = self._snapshot()
            if not wanted <= keys.keys() and self.refresh():
                keys = self._snapshot()
        except VerificationError:
            return {}  # the JWKS is unreachable: the kids stay trusted by name, resolved later
        return {kid: keys[kid] for kid in wanted if kid in keys}

    def _verify_jwt(
        self,
        token: str,
        body: bytes,
        msg_id: str,
        expected_audience: str | None,
        expected_issuer: str | None,
    ) -> dict[str, Any]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise VerificationError("jwt", "malformed JWT") from None
        if header.get("alg") != "EdDSA":
            raise VerificationError("jwt", "JWT alg must be EdDSA")
        kid = header.get("kid")
        if not isinstance(kid, str):
            raise VerificationError("jwt", "JWT has no kid")
        key = self._snapshot().get(kid)
        if key is None and self.refresh():
            key = self._snapshot().get(kid)
        if key is None:
            raise VerificationError("jwt", "JWT kid is not in the trusted JWKS")
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=["EdDSA"],
                audience=expected_audience,
                issuer=expected_issuer,
                options={
                    "require": ["iss", "aud", "iat", "exp", "jti", "taskId", "bodySha256"],
                    "verify_aud": expected_audience is not None,
                    # Times are checked below against this verifier's clock, the same one
                    # that judges webhook-timestamp.
                    "verify_exp": False,
                    "verify_iat": False,
                    "verify_nbf": False,
                },
            )
        except jwt.InvalidAudienceError:
            raise VerificationError("jwt", "JWT audience mismatch") from None
        except jwt.PyJWTError as exc:
            raise VerificationError("jwt", f"JWT invalid: {exc}") from None
        now, leeway = self._clock(), self.jwt_leeway_seconds
        times = {name: claims.get(name) for name in ("exp", "iat", "nbf")}
        for name, value in times.items():
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float)
            ):
                raise VerificationError("jwt", f"JWT {name} is not a NumericDate")
        if now > times["exp"] + leeway:
            raise VerificationError("jwt", "JWT expired")
        if times["iat"] > now + leeway:
            raise VerificationError("jwt", "JWT issued in the future")
        if times["nbf"] is not None and times["nbf"] > now + leeway:
            raise VerificationError("jwt", "JWT not yet valid")
        if not hmac.compare_digest(str(claims["bodySha256"]), _body_sha256(body)):
            raise VerificationError("jwt", "bodySha256 does not match the body")
        if claims["jti"] != msg_id:
            raise VerificationError("jwt", "jti does not match webhook-id")
        return claims


class DeliveryLedger:
    """In-memory receiver bookkeeping: dedupe by event id, order by per-task seq, and the
    binding versions trusted per task. One process only; persist the same three facts (e.g.
    a unique index on the event id) when the receiver has several processes."""

    def __init__(self, max_events: int = 100_000) -> None:
        self.max_events = max_events
        self._lock = threading.Lock()
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._highest: dict[str, int] = {}
        self._bindings: dict[str, list[str]] = {}

    def accept(self, delivery: VerifiedDelivery) -> bool:
        """Record a verified delivery; False when its event id was seen before (a retry)."""
        with self._lock:
            if delivery.event_id in self._seen:
                self._seen.move_to_end(delivery.event_id)
                return False
            self._seen[delivery.event_id] = None
            while len(self._seen) > self.max_events:
                self._seen.popitem(last=False)
            task_id = delivery.task_id
            if task_id is not None:
                if delivery.seq is not None and delivery.seq > self._highest.get(task_id, -1):
                    self._highest[task_id] = delivery.seq
                versions = self._bindings.setdefault(task_id, [])
                if delivery.binding_version and delivery.binding_version not in versions:
                    versions.append(delivery.binding_version)
            return True

    def is_stale(self, task_id: str | None, seq: int | None) -> bool:
        """True when a higher seq of this task was already accepted: drop this update."""
        if task_id is None or seq is None:
            return False
        with self._lock:
            highest = self._highest.get(task_id)
        return highest is not None and seq < highest

    def highest_seq(self, task_id: str) -> int | None:
        with self._lock:
            return self._highest.get(task_id)

    def binding_versions(self, task_id: str) -> tuple[str, ...]:
        """Binding versions this task was delivered under, first seen first."""
        with self._lock:
            return tuple(self._bindings.get(task_id, ()))

    def forget_task(self, task_id: str) -> None:
        """Drop a task's order and binding state (after it is terminal and handled)."""
        with self._lock:
            self._highest.pop(task_id, None)
            self._bindings.pop(task_id, None)


@dataclass
class _TaskChannels:
    # version -> [key ids, origin, path prefix]; insertion order is the order learned.
    channels: dict[str, tuple[list[str], str | None, str | None]] = field(default_factory=dict)
    keys: dict[str, Ed25519PublicKey] = field(default_factory=dict)  # pinned public keys
    orphaned: bool = False

    def key_ids(self) -> set[str]:
        return {kid for kids, _, _ in self.channels.values() for kid in kids}

    def add(self, channel: Channel, max_channels: int) -> None:
        kids, origin, prefix = self.channels.get(channel.version, ([], None, None))
        kids = list(dict.fromkeys([*kids, *channel.key_ids]))[-MAX_CHANNEL_KEY_IDS:]
        self.channels[channel.version] = (
            kids,
            channel.origin or origin,
            channel.path_prefix or prefix,
        )
        while len(self.channels) > max_channels:
            del self.channels[next(iter(self.channels))]
        trusted = self.key_ids()
        self.keys = {kid: key for kid, key in self.keys.items() if kid in trusted}

    def public(self) -> tuple[Channel, ...]:
        return tuple(
            Channel(version, tuple(kids), origin, prefix)
            for version, (kids, origin, prefix) in self.channels.items()
        )


class ChannelTrust:
    """Per-task push-channel trust for `WebhookVerifier.verify(..., channels=...)`. Thread-safe;
    in memory (persist `channels()` and restore with `trust()` to survive a restart).

    Each task has a history of the channels (binding version + key ids) it trusted, and the
    public key of each trusted kid, pinned when first used. A delivery is accepted when its
    binding version is one its task trusted and its signature verifies with a kid the task
    trusts (the kids of any of its channels: after a move, a late retry on the old channel
    may be signed by the new key alone). The task's pinned keys are tried first, so it keeps
    verifying when its keys leave the JWKS or the JWKS is unreachable.

    - A task never seen is trusted on first use: its version and the kid that verified.
    - A verified `channel-changed` notice on a trusted channel adds `newChannel` (and the
      notice's `oldChannel` key ids); kids the verifier does not hold are fetched from the
      JWKS then, or when first used.
    - A verified `channel-orphaned` notice marks the task orphaned (`is_orphaned`); its next
      delivery on a channel it never trusted is trusted on first use again (the operator or
      the client bound it anew), and clears the mark.
    - Anything else raises `ChannelError` and teaches nothing.

    `follow_jwks_rotation=True` also accepts, under a version the task trusts, a key of the
    current JWKS the task does not trust (a key rotation made without a rebind sends no
    notice) and adds it to that channel. Off by default: then a key set changed behind the
    JWKS endpoint cannot sign for tasks already in flight.

    Bounded: at most `max_tasks` tasks (least recently used evicted; an evicted task is trusted
    on first use again) and `max_channels_per_task` channels per task (oldest dropped)."""

    def __init__(
        self,
        *,
        max_tasks: int = 10_000,
        max_channels_per_task: int = 8,
        trust_on_first_use: bool = True,
        follow_jwks_rotation: bool = False,
    ) -> None:
        if max_tasks < 1 or max_channels_per_task < 1:
            raise ValueError("max_tasks and max_channels_per_task must be at least 1")
        self.max_tasks = max_tasks
        self.max_channels_per_task = max_channels_per_task
        self.trust_on_first_use = trust_on_first_use
        self.follow_jwks_rotation = follow_jwks_rotation
        self._lock = threading.Lock()
        self._tasks: OrderedDict[str, _TaskChannels] = OrderedDict()

    def task_count(self) -> int:
        """How many tasks have a channel history now."""
        with self._lock:
            return len(self._tasks)

    def channels(self, task_id: str) -> tuple[Channel, ...]:
        """The channels this task trusts, first learned first (empty for an unknown task)."""
        with self._lock:
            state = self._tasks.get(task_id)
            return state.public() if state is not None else ()

    def is_orphaned(self, task_id: str) -> bool:
        """True after a verified channel-orphaned notice, until the task is trusted anew."""
        with self._lock:
            state = self._tasks.get(task_id)
            return state is not None and state.orphaned

    def trust(self, task_id: str, version: str, key_ids: Iterable[str]) -> None:
        """Add a channel to a task's history (e.g. restored from your database). The kids'
        public keys are taken from the JWKS when first used, then pinned."""
        kids = tuple(dict.fromkeys(key_ids))
        if not version or not kids:
            raise ValueError("a channel needs a version and at least one key id")
        with self._lock:
            self._state(task_id).add(Channel(version, kids), self.max_channels_per_task)
            self._evict()

    def forget_task(self, task_id: str) -> None:
        """Drop a task's channels (after it is terminal and handled)."""
        with self._lock:
            self._tasks.pop(task_id, None)

    # --- used by WebhookVerifier.verify ----------------------------------------------------

    def _state(self, task_id: str) -> _TaskChannels:
        state = self._tasks.get(task_id)
        if state is None:
            state = self._tasks[task_id] = _TaskChannels()
        self._tasks.move_to_end(task_id)
        return state

    def _evict(self) -> None:
        while len(self._tasks) > self.max_tasks:
            self._tasks.popitem(last=False)

    def _keys_of(
        self, task_id: str, version: str | None = None
    ) -> tuple[dict[str, Ed25519PublicKey], tuple[str, ...]]:
        """The task's pinned keys and its trusted kids, read before the delivery is verified
        (so this does not count as a use of the task). None for an orphaned task's delivery
        under a version it never trusted: that is a first use, verified as a new task's is
        (its kid is the newest that signs, not a pin of the cut-over channel, which may
        retire)."""
        with self._lock:
            state = self._tasks.get(task_id)
            if state is None or state.orphaned and version not in state.channels:
                return {}, ()
            return dict(state.keys), tuple(sorted(state.key_ids()))

    def _admit(
        self,
        verifier: WebhookVerifier,
        delivery: VerifiedDelivery,
        key: Ed25519PublicKey,
        offered_key_ids: tuple[str, ...],
    ) -> None:
        task_id, version, kid = delivery.task_id, delivery.binding_version, delivery.key_id

        def refuse(why: str, state: _TaskChannels | None = None) -> ChannelError:
            return ChannelError(
                why,
                task_id=task_id,
                offered_version=version,
                key_id=kid,
                offered_key_ids=offered_key_ids,
                trusted=state.public() if state is not None else (),
                orphaned=state is not None and state.orphaned,
                delivery=delivery,
            )

        if task_id is None:
            raise refuse("the delivery names no task, so no per-task channel can admit it")
        if version is None or kid is None:
            raise refuse("the delivery has no X-A2A-Binding-Version")
        notice = parse_channel_notice(delivery)  # a malformed notice is refused before use
        if notice is not None and notice.old_channel.version != version:
            raise _notice_error(
                f"oldChannel.version {notice.old_channel.version} is not the binding version "
                f"it arrived under ({version})"
            )

        with self._lock:
            state = self._tasks.get(task_id)
            trusted_version = state is not None and version in state.channels
            if state is not None and trusted_version and kid in state.key_ids():
                pass
            elif state is not None and trusted_version and self.follow_jwks_rotation:
                state.add(Channel(version, (kid,)), self.max_channels_per_task)
            elif (state is None or state.orphaned) and self.trust_on_first_use:
                state = self._state(task_id)
                state.add(Channel(version, (kid,)), self.max_channels_per_task)
                state.orphaned = False
                logger.info(
                    "webhook channel trusted on first use",
                    extra={"task_id": task_id, "binding_version": version, "kid": kid},
                )
            elif state is None:
                raise refuse("the task is unknown and trust on first use is off")
            elif not trusted_version:
                raise refuse(f"version {version} is not a channel of this task", state)
            else:
                raise refuse(f"key {kid} is not trusted for this task", state)
            self._state(task_id).keys.setdefault(kid, key)
            self._evict()
            if notice is None:
                return
            wanted = {*notice.old_channel.key_ids}
            if notice.new_channel is not None:
                wanted.update(notice.new_channel.key_ids)
            wanted -= state.keys.keys()

        # Outside the lock: this may fetch the JWKS.
        fetched = verifier._public_keys(wanted)

        with self._lock:
            # The delivery was admitted above; re-read the task, which may have been evicted.
            state = self._state(task_id)
            state.add(
                Channel(version, (kid, *notice.old_channel.key_ids)), self.max_channels_per_task
            )
            if notice.new_channel is not None:
                state.add(notice.new_channel, self.max_channels_per_task)
            trusted = state.key_ids()
            for fetched_kid, fetched_key in fetched.items():
                if fetched_kid in trusted:
                    state.keys.setdefault(fetched_kid, fetched_key)
            if notice.kind == NOTICE_CHANNEL_ORPHANED:
                state.orphaned = True
            self._evict()
        logger.info(
            "webhook channel notice applied",
            extra={
                "task_id": task_id,
                "binding_version": version,
                "notice": notice.kind,
                "rebind_id": notice.rebind_id,
                "new_binding_version": notice.new_channel.version if notice.new_channel else None,
            },
        )
