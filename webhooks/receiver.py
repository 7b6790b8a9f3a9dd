"""Receiver side: verify push deliveries from this platform (for A2A clients and our tests).

Standalone on purpose: no Django. It needs `cryptography` and `PyJWT`, and `httpx` only when
it fetches the JWKS itself. See docs/webhooks-receiving.md.

    verifier = WebhookVerifier(jwks_url="https://agents.example.com/.well-known/jwks.json")
    ledger = DeliveryLedger()

    delivery = verifier.verify(request_headers, raw_body, expected_audience=MY_WEBHOOK_URL)
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

`X-A2A-Task-Seq` and `X-A2A-Binding-Version` are not covered by the Standard Webhooks
signature; they are trustworthy when the JWT carries them too (checked in step 4) or the
transport is TLS to your own endpoint.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
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

JwksFetcher = Callable[[str], Mapping[str, Any]]


class VerificationError(Exception):
    """A delivery failed verification. `reason` is one of: headers, stale, signature, jwt,
    token, payload, jwks. Answer the sender with a 4xx (401 for signature/jwt/token)."""

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
            # The lock is held across the fetch on purpose: concurrent verifications that all
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
    ) -> VerifiedDelivery:
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

        key_id = self._verify_signature(h, msg_id, raw_ts, raw_sigs, body)

        seq = self._parse_seq(h.get(HEADER_TASK_SEQ))
        binding_version = h.get(HEADER_BINDING_VERSION) or None
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

        return VerifiedDelivery(
            event_id=msg_id,
            task_id=task_id,
            seq=seq,
            binding_version=binding_version,
            timestamp=timestamp,
            payload=payload,
            key_id=key_id,
            jwt_claims=claims,
        )

    @staticmethod
    def _parse_seq(raw: str | None) -> int | None:
        if raw is None or raw.strip() == "":
            return None
        if not raw.strip().isdigit():
            raise VerificationError("headers", "X-A2A-Task-Seq is not a non-negative integer")
        return int(raw.strip())

    def _verify_signature(
        self, h: Mapping[str, str], msg_id: str, raw_ts: str, raw_sigs: str, body: bytes
    ) -> str:
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

        kid = self._match(self._snapshot(), signatures, hints, signed)
        if kid is None and self.refresh():
            kid = self._match(self._snapshot(), signatures, hints, signed)
        if kid is None:
            raise VerificationError("signature", "no signature verifies with a trusted key")
        return kid

    @staticmethod
    def _match(
        keys: Mapping[str, Ed25519PublicKey],
        signatures: list[bytes],
        hints: list[str],
        signed: bytes,
    ) -> str | None:
        # Hinted kids first (the sender lists them in signature order), then every key.
        order = [k for k in hints if k in keys] + [k for k in keys if k not in hints]
        for kid in order:
            for signature in signatures:
                try:
                    keys[kid].verify(signature, signed)
                except InvalidSignature:
                    continue
                return kid
        return None

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
