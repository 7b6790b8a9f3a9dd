"""Where a webhook may be sent: public addresses, or networks the operator allowlisted.

A2A §13.2 / §14.1.1 (digest §9): a push URL is attacker-chosen, so the server must not become
a proxy into its own network. `check_url` is the early, explainable refusal (registration time
and before each send); the transport repeats `check_address` on every address it resolves at
connect time and connects to the checked address, so DNS rebinding between the two cannot
slip through (webhooks/delivery/transport.py).

Refusals raise `UnsafeDestination(reason, message)`; `reason` is one of `REASONS`.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import quote, urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

MAX_URL_LENGTH = 2048

REASONS = frozenset(
    {
        # the address
        "loopback",
        "private",
        "link_local",
        "metadata",
        "cgnat",
        "multicast",
        "broadcast",
        "reserved",
        "unspecified",
        "unique_local",
        "site_local",
        "not_global",
        "invalid_address",
        # the URL
        "too_long",
        "invalid_url",
        "scheme",
        "userinfo",
        "host",
        "port",
        "unresolvable",
    }
)


class UnsafeDestination(Exception):
    """A webhook destination we refuse; `str()` is the human message."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class ParsedTarget:
    """A checked destination: what the transport requests is built from these parts alone, so
    a second URL parser can never see another host. `host` is what is resolved and sent as
    Host/SNI: an ASCII (IDNA) hostname, or the normalized IP literal (so `http://0x7f.1/`
    becomes `127.0.0.1`, `literal` set)."""

    scheme: str
    host: str
    port: int
    path_qs: str
    literal: bool = False


# --- allowlist ---------------------------------------------------------------------------


def allowed_networks() -> tuple[IPNetwork, ...]:
    """`settings.A2A_WEBHOOK_ALLOWED_NETWORKS` (CIDRs), read now, so overrides take effect."""
    raw = getattr(settings, "A2A_WEBHOOK_ALLOWED_NETWORKS", ()) or ()
    if isinstance(raw, str):
        raw = raw.split(",")
    return _parse_networks(tuple(str(item).strip() for item in raw if str(item).strip()))


@lru_cache(maxsize=8)
def _parse_networks(items: tuple[str, ...]) -> tuple[IPNetwork, ...]:
    networks = []
    for item in items:
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError as exc:
            raise ImproperlyConfigured(
                f"A2A_WEBHOOK_ALLOWED_NETWORKS: {item!r} is not a CIDR network"
            ) from exc
    return tuple(networks)


def _allowlisted(addr: IPAddress, networks: tuple[IPNetwork, ...]) -> bool:
    return any(addr.version == net.version and addr in net for net in networks)


# --- addresses ---------------------------------------------------------------------------

_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network

# Checked in order; the first match names the reason. Python's ipaddress (3.11.7 here) still
# calls ::ffff:8.8.8.8, ::7f00:1, fec0::/10, 3fff::/20 and 64:ff9b:1::/48 "global", so the
# table is explicit and `is_global` is only the final net.
_V4_FORBIDDEN: tuple[tuple[ipaddress.IPv4Network, str], ...] = (
    (_V4("0.0.0.0/8"), "unspecified"),
    (_V4("168.63.129.16/32"), "metadata"),  # Azure's host endpoint (WireServer): public space
    (_V4("10.0.0.0/8"), "private"),
    (_V4("100.64.0.0/10"), "cgnat"),
    (_V4("127.0.0.0/8"), "loopback"),
    (_V4("169.254.0.0/16"), "link_local"),  # 169.254.169.254: cloud metadata
    (_V4("172.16.0.0/12"), "private"),
    (_V4("192.0.0.0/24"), "reserved"),  # IETF protocol assignments
    (_V4("192.0.2.0/24"), "reserved"),  # TEST-NET-1 (documentation)
    (_V4("192.88.99.0/24"), "reserved"),  # deprecated 6to4 relay anycast
    (_V4("192.168.0.0/16"), "private"),
    (_V4("198.18.0.0/15"), "reserved"),  # benchmarking
    (_V4("198.51.100.0/24"), "reserved"),  # TEST-NET-2
    (_V4("203.0.113.0/24"), "reserved"),  # TEST-NET-3
    (_V4("224.0.0.0/4"), "multicast"),
    (_V4("255.255.255.255/32"), "broadcast"),
    (_V4("240.0.0.0/4"), "reserved"),
)

_V6_NAT64 = _V6("64:ff9b::/96")
_V6_6TO4 = _V6("2002::/16")
_V6_TEREDO = _V6("2001::/32")
_V6_FORBIDDEN: tuple[tuple[ipaddress.IPv6Network, str], ...] = (
    (_V6("::/128"), "unspecified"),
    (_V6("::1/128"), "loopback"),
    (_V6("::/96"), "reserved"),  # deprecated IPv4-compatible addresses
    (_V6("64:ff9b:1::/48"), "reserved"),  # local-use NAT64 (RFC 8215): a site's own gateway
    (_V6("100::/64"), "reserved"),  # discard-only
    (_V6("2001:db8::/32"), "reserved"),  # documentation
    (_V6("3fff::/20"), "reserved"),  # documentation (RFC 9637)
    (_V6("fc00::/7"), "unique_local"),
    (_V6("fe80::/10"), "link_local"),
    (_V6("fec0::/10"), "site_local"),
    (_V6("ff00::/8"), "multicast"),
)

_MESSAGES = {
    "loopback": "is a loopback address",
    "private": "is a private (RFC 1918) address",
    "link_local": "is a link-local address (this includes cloud metadata services)",
    "metadata": "is a cloud provider's metadata or host service",
    "cgnat": "is a carrier-grade NAT (100.64.0.0/10) address",
    "multicast": "is a multicast address",
    "broadcast": "is the broadcast address",
    "reserved": "is a reserved or documentation address",
    "unspecified": "is an unspecified (0.0.0.0/8 or ::) address",
    "unique_local": "is a unique-local (fc00::/7) address",
    "site_local": "is a site-local (fec0::/10) address",
    "not_global": "is not a globally routable address",
}


def _parse_address(ip: str | IPAddress) -> IPAddress:
    if isinstance(ip, ipaddress.IPv4Address | ipaddress.IPv6Address):
        return ip
    try:
        return ipaddress.ip_address(str(ip))
    except ValueError:
        raise UnsafeDestination("invalid_address", f"{ip!r} is not an IP address") from None


def _v4_reason(addr: ipaddress.IPv4Address) -> str | None:
    for network, reason in _V4_FORBIDDEN:
        if addr in network:
            return reason
    return None if addr.is_global else "not_global"


def _v6_reason(addr: ipaddress.IPv6Address) -> tuple[str, str] | None:
    """(reason, detail) or None; detail names an embedded IPv4 address when that decided."""
    if addr in _V6_NAT64:
        # Well-known NAT64 (RFC 6052): a DNS64 network reaches every IPv4-only receiver
        # through it, so it is as safe as the IPv4 address it carries.
        embedded = ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
        reason = _v4_reason(embedded)
        return (reason, f"embeds {embedded} (NAT64), which") if reason else None
    for network, reason in _V6_FORBIDDEN:
        if addr in network:
            return reason, ""
    embedded_v4: list[tuple[ipaddress.IPv4Address, str]] = []
    if addr in _V6_6TO4 and addr.sixtofour is not None:
        embedded_v4.append((addr.sixtofour, "6to4"))
    if addr in _V6_TEREDO and addr.teredo is not None:
        server, client = addr.teredo
        embedded_v4 += [(server, "Teredo server"), (client, "Teredo client")]
    for embedded, how in embedded_v4:
        reason = _v4_reason(embedded)
        if reason:
            return reason, f"embeds {embedded} ({how}), which"
    if embedded_v4:
        # Deprecated transition mechanisms (RFC 7526, RFC 4380) whose relays we do not
        # control; newer Pythons call them non-global too, so refuse them on every version.
        return "not_global", ""
    if addr.is_reserved:
        return "reserved", ""
    if not addr.is_global:
        return "not_global", ""
    return None


def check_address(ip: str | IPAddress) -> None:
    """Refuse (UnsafeDestination) unless `ip` is public or inside an allowlisted network."""
    addr = _parse_address(ip)
    networks = allowed_networks()
    if _allowlisted(addr, networks):
        return
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            # ::ffff:a.b.c.d is the IPv4 host itself on a dual-stack socket.
            check_address(addr.ipv4_mapped)
            return
        found = _v6_reason(addr)
        if found is None:
            return
        reason, detail = found
    else:
        reason, detail = _v4_reason(addr), ""
        if reason is None:
            return
    text = f"{addr} {detail} {_MESSAGES[reason]}" if detail else f"{addr} {_MESSAGES[reason]}"
    raise UnsafeDestination(reason, text + " and is not in A2A_WEBHOOK_ALLOWED_NETWORKS")


def is_allowlisted(ip: str | IPAddress) -> bool:
    addr = _parse_address(ip)
    networks = allowed_networks()
    if _allowlisted(addr, networks):
        return True
    mapped = getattr(addr, "ipv4_mapped", None)
    return mapped is not None and _allowlisted(mapped, networks)


# --- URLs --------------------------------------------------------------------------------

# Whitespace and control characters are silently stripped by some parsers (urllib drops tab
# and newline) and a backslash is a path separator to WHATWG parsers but not to urllib: both
# let two parsers disagree about the host, so neither is accepted anywhere in the URL.
_FORBIDDEN_CHARS = re.compile(r"[\x00-\x20\x7f\\]")
_PRINTABLE_ASCII = "".join(chr(c) for c in range(0x21, 0x7F))
_LABEL = re.compile(r"^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$")
_NUMERIC_LABEL = re.compile(r"^(?:[0-9]+|0x[0-9a-f]*)$")


def _literal_host(host: str, bracketed: bool) -> IPAddress | None:
    """The address a browser or libc would read in `host`, or None for a DNS name.

    Like the WHATWG URL parser, a host whose last label is a number is an IPv4 address in
    one of inet_aton's forms (2130706433, 0177.0.0.1, 0x7f.1, 127.1), never a name to look up.
    """
    if bracketed:
        try:
            return ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            raise UnsafeDestination("host", f"{host!r} is not an IPv6 address") from None
    trimmed = host[:-1] if host.endswith(".") else host
    if not _NUMERIC_LABEL.match(trimmed.rsplit(".", 1)[-1]):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(trimmed))
    except OSError:
        raise UnsafeDestination("host", f"{host!r} is not a valid IPv4 address") from None


def _ascii_hostname(host: str) -> str:
    try:
        ascii_host = host.encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise UnsafeDestination("host", f"{host!r} is not a valid host name") from None
    labels = ascii_host[:-1].split(".") if ascii_host.endswith(".") else ascii_host.split(".")
    if len(ascii_host) > 253 or not all(_LABEL.match(label) for label in labels):
        raise UnsafeDestination("host", f"{host!r} is not a valid host name")
    return ascii_host


def resolve(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (TCP), in resolver order, without duplicates."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise UnsafeDestination("unresolvable", f"{host} does not resolve") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise UnsafeDestination("unresolvable", f"{host} does not resolve")
    return addresses


def check_url(url: str) -> ParsedTarget:
    """Check a webhook URL and every address its host resolves to; return the checked parts.

    https only; plain http only when every address is in an allowlisted network.
    """
    target = parse_url(url)
    check_addresses(target, [target.host] if target.literal else resolve(target.host, target.port))
    return target


def check_url_at_registration(url: str) -> ParsedTarget:
    """`check_url` when A2A_WEBHOOK_RESOLVE_AT_REGISTRATION is on (the default). Off, a host
    name is not resolved here: the URL's form and an IP literal's address are still checked,
    and the name's addresses are checked at connect time, as on every send (the transport's
    resolver runs `check_addresses`), so a name that resolves nowhere, or somewhere private,
    fails its deliveries instead of its registration. For networks without public DNS."""
    if getattr(settings, "A2A_WEBHOOK_RESOLVE_AT_REGISTRATION", True):
        return check_url(url)
    target = parse_url(url)
    if target.literal:
        check_addresses(target, [target.host])
    return target


def check_addresses(target: ParsedTarget, addresses: list[str]) -> None:
    """Refuse unless every address is public or allowlisted and, for plain http, every one is
    allowlisted. Run on the addresses a URL resolves to, and again at connect time."""
    for address in addresses:
        check_address(address)
    if target.scheme == "http" and not all(is_allowlisted(a) for a in addresses):
        raise UnsafeDestination(
            "scheme", "plain http is allowed only to A2A_WEBHOOK_ALLOWED_NETWORKS; use https"
        )


@lru_cache(maxsize=4096)
def parse_url(url: str) -> ParsedTarget:
    """The URL's checked parts, without resolving its host: scheme, a normalized host (an IP
    literal in any form becomes its canonical address, `literal` set), port and path.
    A function of the URL alone (no setting), so each process parses a webhook URL once; a
    refusal raises and is not cached."""
    if not isinstance(url, str) or not url:
        raise UnsafeDestination("invalid_url", "the URL is empty")
    if len(url) > MAX_URL_LENGTH:
        raise UnsafeDestination("too_long", f"the URL is longer than {MAX_URL_LENGTH} characters")
    if _FORBIDDEN_CHARS.search(url):
        raise UnsafeDestination(
            "invalid_url", "the URL contains whitespace, control characters or a backslash"
        )
    try:
        parts = urlsplit(url)
    except ValueError:
        raise UnsafeDestination("invalid_url", "the URL cannot be parsed") from None
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http"):
        raise UnsafeDestination("scheme", "only https (or http to allowlisted networks) is allowed")
    if "@" in parts.netloc:
        raise UnsafeDestination("userinfo", "credentials in the URL are not allowed")
    host = parts.hostname or ""
    if not host:
        raise UnsafeDestination("host", "the URL has no host")
    try:
        port = parts.port
    except ValueError:
        raise UnsafeDestination("port", "the port must be a number from 1 to 65535") from None
    if port is None:
        port = 443 if scheme == "https" else 80
    elif not 1 <= port <= 65535:
        raise UnsafeDestination("port", "the port must be a number from 1 to 65535")

    literal = _literal_host(host, bracketed=parts.netloc.rsplit("@", 1)[-1].startswith("["))
    host = str(literal) if literal is not None else _ascii_hostname(host)
    path_qs = parts.path or "/"
    if parts.query:
        path_qs += "?" + parts.query
    # A non-ASCII path or query is sent as its UTF-8 percent-encoding (RFC 3987 §3.1, what
    # browsers do); it could not go on the request line as is.
    path_qs = quote(path_qs, safe=_PRINTABLE_ASCII)
    return ParsedTarget(
        scheme=scheme, host=host, port=port, path_qs=path_qs, literal=literal is not None
    )
