"""webhooks.delivery.ssrf: which addresses and URLs a webhook may target.

DNS is the edge we do not own: every test here resolves through a fake `socket.getaddrinfo`
table, so nothing leaves the machine.
"""

from __future__ import annotations

import ipaddress
import socket

import pytest
from django.core.exceptions import ImproperlyConfigured

from webhooks.delivery import ssrf
from webhooks.delivery.ssrf import (
    ParsedTarget,
    UnsafeDestination,
    check_address,
    check_url,
    parse_url,
)

PUBLIC_V4 = "93.184.215.14"
PUBLIC_V6 = "2606:4700:4700::1111"

FAKE_DNS: dict[str, list[str]] = {
    "public.test": [PUBLIC_V4],
    "public6.test": [PUBLIC_V6, PUBLIC_V4],
    "mixed.test": [PUBLIC_V4, "10.0.0.5"],
    "mixed-allowlisted.test": ["10.0.0.5", PUBLIC_V4],
    "internal.test": ["10.0.0.5"],
    "v6local.test": ["::1"],
    "metadata.test": ["169.254.169.254"],
    "mapped.test": ["::ffff:127.0.0.1"],
    "localhost": ["127.0.0.1", "::1"],
    "xn--bcher-kva.test": [PUBLIC_V4],
}


@pytest.fixture(autouse=True)
def fake_dns(monkeypatch):
    calls: list[str] = []

    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):  # noqa: A002
        calls.append(host)
        if host not in FAKE_DNS:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        infos = []
        for address in FAKE_DNS[host]:
            if ":" in address:
                infos.append((socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, port, 0, 0)))
            else:
                infos.append((socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port)))
        return infos

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return calls


@pytest.fixture(autouse=True)
def no_allowlist(settings):
    settings.A2A_WEBHOOK_ALLOWED_NETWORKS = []


def refusal(fn, *args) -> UnsafeDestination:
    with pytest.raises(UnsafeDestination) as info:
        fn(*args)
    assert info.value.reason in ssrf.REASONS
    assert str(info.value)  # a human message
    return info.value


# --- addresses ---------------------------------------------------------------------------

REFUSED_ADDRESSES = [
    # IPv4
    ("127.0.0.1", "loopback"),
    ("127.255.255.254", "loopback"),
    ("10.1.2.3", "private"),
    ("172.16.0.1", "private"),
    ("172.31.255.255", "private"),
    ("192.168.1.1", "private"),
    ("169.254.169.254", "link_local"),  # cloud metadata
    ("169.254.0.1", "link_local"),
    ("100.64.0.1", "cgnat"),
    ("100.127.255.254", "cgnat"),
    ("224.0.0.1", "multicast"),
    ("239.255.255.250", "multicast"),
    ("240.0.0.1", "reserved"),
    ("255.255.255.255", "broadcast"),
    ("0.0.0.0", "unspecified"),
    ("0.1.2.3", "unspecified"),
    ("192.0.0.8", "reserved"),
    ("192.0.2.1", "reserved"),  # documentation
    ("198.51.100.7", "reserved"),  # documentation
    ("203.0.113.9", "reserved"),  # documentation
    ("198.18.0.1", "reserved"),  # benchmarking
    ("192.88.99.1", "reserved"),
    # IPv6
    ("::1", "loopback"),
    ("::", "unspecified"),
    ("fe80::1", "link_local"),
    ("febf:ffff::1", "link_local"),
    ("fc00::1", "unique_local"),
    ("fd12:3456::1", "unique_local"),
    ("fd00:ec2::254", "unique_local"),  # AWS metadata over IPv6
    ("168.63.129.16", "metadata"),  # Azure's host endpoint, in public space
    ("::ffff:168.63.129.16", "metadata"),
    ("fec0::1", "site_local"),
    ("ff02::1", "multicast"),
    ("ff0e::1", "multicast"),
    ("2001:db8::1", "reserved"),  # documentation
    ("3fff::1", "reserved"),  # documentation (RFC 9637)
    ("100::1", "reserved"),  # discard-only
    ("::7f00:1", "reserved"),  # IPv4-compatible ::127.0.0.1
    # IPv4-mapped: the IPv4 host itself
    ("::ffff:127.0.0.1", "loopback"),
    ("::ffff:10.0.0.1", "private"),
    ("::ffff:169.254.169.254", "link_local"),
    ("::ffff:0.0.0.0", "unspecified"),
    # NAT64 well-known prefix embedding a forbidden IPv4; local-use NAT64 entirely
    ("64:ff9b::7f00:1", "loopback"),
    ("64:ff9b::a9fe:a9fe", "link_local"),
    ("64:ff9b::c0a8:101", "private"),
    ("64:ff9b:1::808:808", "reserved"),
    # 6to4 embedding a forbidden IPv4
    ("2002:7f00:1::1", "loopback"),
    ("2002:c0a8:101::1", "private"),
    ("2002:a9fe:a9fe::1", "link_local"),
    # Teredo: server 8.8.8.8, client 127.0.0.1 (stored inverted), and the RFC 4380 example
    ("2001:0:808:808:0:0:80ff:fffe", "loopback"),
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "reserved"),
]


@pytest.mark.parametrize(("address", "reason"), REFUSED_ADDRESSES)
def test_check_address_refuses(address, reason):
    assert refusal(check_address, address).reason == reason


@pytest.mark.parametrize(
    "address",
    [
        "8.8.8.8",
        "1.1.1.1",
        PUBLIC_V4,
        "100.128.0.1",  # just above CGNAT
        "172.32.0.1",  # just above 172.16/12
        "11.0.0.1",
        PUBLIC_V6,
        "2001:4860:4860::8888",
        "::ffff:8.8.8.8",  # mapped public
        "64:ff9b::808:808",  # NAT64 of a public address (DNS64 networks)
    ],
)
def test_check_address_accepts_public(address):
    check_address(address)
    check_address(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    "address",
    [
        "2001:0:808:808:0:0:f7f7:f7f7",  # Teredo, server and client 8.8.8.8
        "2002:808:808::1",  # 6to4 of 8.8.8.8
    ],
)
def test_check_address_refuses_transition_addresses_with_public_parts(address):
    # Deprecated relays we do not control; refused whatever they embed, on every Python.
    assert refusal(check_address, address).reason == "not_global"


def test_check_address_invalid():
    assert refusal(check_address, "not-an-ip").reason == "invalid_address"


def test_check_address_message_names_embedded_address():
    exc = refusal(check_address, "64:ff9b::7f00:1")
    assert "127.0.0.1" in str(exc)
    assert "NAT64" in str(exc)


# --- allowlist ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("allowlist", "address", "allowed"),
    [
        (["127.0.0.0/8"], "127.0.0.1", True),
        (["127.0.0.0/8"], "127.3.2.1", True),
        (["127.0.0.0/8"], "::ffff:127.0.0.1", True),  # the same host
        (["127.0.0.0/8"], "::1", False),
        (["127.0.0.0/8"], "10.0.0.1", False),
        (["127.0.0.0/8"], "64:ff9b::7f00:1", False),  # via a NAT64 gateway: not the same
        (["127.0.0.0/8"], "2002:7f00:1::1", False),
        (["10.0.0.0/8", "fd00::/8"], "10.20.30.40", True),
        (["10.0.0.0/8", "fd00::/8"], "fd12::1", True),
        (["10.0.0.0/8", "fd00::/8"], "fc00::1", False),
        (["169.254.169.254/32"], "169.254.169.254", True),
        (["169.254.169.254/32"], "169.254.169.253", False),
        (" 192.168.0.0/16 , ::1/128 ", "192.168.4.4", True),  # a string, as in the env
        (" 192.168.0.0/16 , ::1/128 ", "::1", True),
        (["10.0.0.1"], "10.0.0.1", True),  # a bare address is a /32
        ([], "127.0.0.1", False),
    ],
)
def test_allowlist_wins(settings, allowlist, address, allowed):
    settings.A2A_WEBHOOK_ALLOWED_NETWORKS = allowlist
    if allowed:
        check_address(address)
    else:
        refusal(check_address, address)


def test_allowlist_read_at_call_time(settings):
    refusal(check_address, "127.0.0.1")
    settings.A2A_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    check_address("127.0.0.1")
    settings.A2A_WEBHOOK_ALLOWED_NETWORKS = []
    refusal(check_address, "127.0.0.1")


def test_allowed_networks_parses_and_rejects_garbage(settings):
    settings.A2A_WEBHOOK_ALLOWED_NETWORKS = ["10.0.0.0/8", "", "::1"]
    assert ssrf.allowed_networks() == (
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("::1/128"),
    )
    settings.A2A_WEBHOOK_ALLOWED_NETWORKS = ["10.0.0.0/33"]
    with pytest.raises(ImproperlyConfigured):
        ssrf.allowed_networks()


def test_allowlist_empty_by_default():
    """Production default: nothing allowlisted (make run/test set loopback explicitly)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "A2A_WEBHOOK_ALLOWED_NETWORKS"}
    code = "import a2a_platform.settings as s; print(repr(s.A2A_WEBHOOK_ALLOWED_NETWORKS))"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


# --- URLs: IP literals in every form ---------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("https://127.0.0.1/", "loopback"),
        ("https://2130706433/", "loopback"),  # decimal
        ("http://2130706433/", "loopback"),
        ("https://0177.0.0.1/", "loopback"),  # octal
        ("https://0x7f.1/", "loopback"),  # hex, short
        ("https://0x7f000001/", "loopback"),
        ("https://017700000001/", "loopback"),
        ("https://127.1/", "loopback"),  # short form
        ("https://127.0.1/", "loopback"),
        ("https://127.0.0.1./", "loopback"),  # trailing dot
        ("https://0/", "unspecified"),
        ("https://0.0.0.0:8080/", "unspecified"),
        ("https://10.1/", "private"),
        ("https://0xa9.0xfe.0xa9.0xfe/latest/meta-data/", "link_local"),
        ("https://169.254.169.254/latest/meta-data/", "link_local"),
        ("https://[::1]/", "loopback"),
        ("https://[::ffff:127.0.0.1]/", "loopback"),
        ("https://[::ffff:7f00:1]/", "loopback"),
        ("https://[0:0:0:0:0:ffff:a9fe:a9fe]/", "link_local"),
        ("https://[fe80::1%25eth0]/", "link_local"),
        ("https://[fd00::1]:8443/", "unique_local"),
        ("https://[64:ff9b::7f00:1]/", "loopback"),
        ("https://[2002:7f00:1::]/", "loopback"),
    ],
)
def test_check_url_refuses_ip_literals(url, reason, fake_dns):
    assert refusal(check_url, url).reason == reason
    assert fake_dns == []  # a literal is never looked up


@pytest.mark.parametrize(
    "url",
    ["https://1.2.3.4.5/", "https://08.1.1.1/", "https://0x/", "https://256.1.1.1/"],
)
def test_check_url_refuses_malformed_ip_literals(url):
    assert refusal(check_url, url).reason == "host"


def test_check_url_normalizes_literals(settings):
    settings.A2A_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    target = check_url("http://0x7f.1:8080/hook?a=1&b=2#frag")
    assert target == ParsedTarget("http", "127.0.0.1", 8080, "/hook?a=1&b=2", literal=True)
    assert check_url("http://2130706433") == ParsedTarget("http", "127.0.0.1", 80, "/", True)


def test_check_url_public_literals():
    assert check_url(f"https://{PUBLIC_V4}/x").host == PUBLIC_V4
    target = check_url(f"https://[{PUBLIC_V6}]:8443/")
    assert target == ParsedTarget("https", PUBLIC_V6, 8443, "/", literal=True)


# --- URLs: names, resolution and every address ---------------------------------------------


def test_check_url_public_name(fake_dns):
    target = check_url("HTTPS://Public.TEST:443/a/b?c=d")
    assert target == ParsedTarget("https", "public.test", 443, "/a/b?c=d")
    assert fake_dns == ["public.test"]


def test_check_url_public_name_with_both_families():
    assert check_url("https://public6.test/").host == "public6.test"


def test_check_url_idn_is_resolved_as_punycode():
    assert check_url("https://bücher.test/").host == "xn--bcher-kva.test"


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("https://mixed.test/", "private"),  # EVERY address is checked
        ("https://internal.test/", "private"),
        ("https://v6local.test/", "loopback"),
        ("https://metadata.test/", "link_local"),
        ("https://mapped.test/", "loopback"),
        ("https://localhost/", "loopback"),
        ("https://nowhere.test/", "unresolvable"),
    ],
)
def test_check_url_refuses_names_resolving_badly(url, reason):
    assert refusal(check_url, url).reason == reason


def test_check_url_localhost_needs_both_families_allowlisted(settings):
    settings.A2A_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    assert refusal(check_url, "https://localhost/").reason == "loopback"  # ::1
    settings.A2A_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8", "::1/128"]
    assert check_url("http://localhost:9000/").port == 9000


# --- URLs: schemes, plain http ---------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "ftp://public.test/",
        "file:///etc/passwd",
        "gopher://public.test/",
        "javascript:alert(1)",
        "ws://public.test/",
        "//public.test/path",
        "public.test/path",
    ],
)
def test_check_url_refuses_schemes(url):
    assert refusal(check_url, url).reason == "scheme"


def test_check_url_plain_http_only_to_allowlisted(settings):
    assert refusal(check_url, "http://public.test/").reason == "scheme"
    assert refusal(check_url, f"http://{PUBLIC_V4}/").reason == "scheme"
    settings.A2A_WEBHOOK_ALLOWED_NETWORKS = ["10.0.0.0/8"]
    assert check_url("http://internal.test/hook").scheme == "http"
    # one resolved address outside the allowlist is enough to require https
    assert refusal(check_url, "http://mixed-allowlisted.test/").reason == "scheme"
    assert check_url("https://mixed-allowlisted.test/").scheme == "https"


# --- URLs: shape -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "https://user:pass@public.test/",
        "https://user@public.test/",
        "https://@public.test/",
        "https://public.test@127.0.0.1/",
        "https://user:pass@[::1]/",
    ],
)
def test_check_url_refuses_userinfo(url):
    assert refusal(check_url, url).reason == "userinfo"


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("https:///path", "host"),
        ("https://:443/", "host"),
        ("https://public.test:0/", "port"),
        ("https://public.test:65536/", "port"),
        ("https://public.test:99999/", "port"),
        ("https://public.test:abc/", "port"),
        ("https://public.test:-1/", "port"),
        ("https://exa_mple..test/", "host"),
        ("https://%31%32%37.0.0.1/", "host"),  # percent-encoded host
        ("https://a" + "b" * 64 + ".test/", "host"),  # label over 63
        ("https://public.test/" + "a" * 2048, "too_long"),
        ("https://exa mple.test/", "invalid_url"),
        ("https://public.test\\@127.0.0.1/", "invalid_url"),
        ("https://public.test/\n", "invalid_url"),
        ("https://pub\tlic.test/", "invalid_url"),
        ("https://public.test/\x00", "invalid_url"),
        ("https://[::1/", "invalid_url"),
        ("https://[::zz]/", "invalid_url"),
        ("", "invalid_url"),
    ],
)
def test_check_url_refuses_malformed(url, reason):
    assert refusal(check_url, url).reason == reason


def test_check_url_accepts_port_bounds_and_max_length():
    assert check_url("https://public.test:1/").port == 1
    assert check_url("https://public.test:65535/").port == 65535
    url = "https://public.test/"
    url += "a" * (ssrf.MAX_URL_LENGTH - len(url))
    assert check_url(url).path_qs.startswith("/aaa")


def test_unsafe_destination_str_is_the_message():
    exc = refusal(check_url, "https://127.0.0.1/")
    assert exc.reason == "loopback"
    assert str(exc) == exc.message
    assert "127.0.0.1" in str(exc)


def test_parse_url_percent_encodes_a_non_ascii_path_and_query_only():
    target = parse_url("https://hooks.example.org/h\u00fck/%41?q=\u00fc&x=%20")
    assert target.path_qs == "/h%C3%BCk/%41?q=%C3%BC&x=%20"  # existing escapes kept as sent
    assert parse_url("https://hooks.example.org/a?b=c").path_qs == "/a?b=c"
