"""common.client_ip: the address lockout and throttling count under, from Django and from ASGI."""

import pytest
from django.test import RequestFactory

from common.client_ip import client_ip, client_ip_from_scope, normalize


def _request(remote="10.0.0.9", xff=None):
    extra = {"REMOTE_ADDR": remote}
    if xff is not None:
        extra["HTTP_X_FORWARDED_FOR"] = xff
    return RequestFactory().get("/admin/login/", **extra)


def test_no_trusted_hop_ignores_the_header_a_client_can_write():
    assert client_ip(_request(xff="203.0.113.7"), trusted_hops=0) == "10.0.0.9"


def test_one_hop_takes_the_address_the_proxy_appended_not_the_clients_claim():
    request = _request(xff="1.1.1.1, 203.0.113.7")  # "1.1.1.1" was sent by the client itself
    assert client_ip(request, trusted_hops=1) == "203.0.113.7"
    assert client_ip(request, trusted_hops=2) == "1.1.1.1"


def test_fewer_entries_than_hops_falls_back_to_the_peer():
    assert client_ip(_request(xff="203.0.113.7"), trusted_hops=2) == "10.0.0.9"
    assert client_ip(_request(), trusted_hops=1) == "10.0.0.9"


@pytest.mark.parametrize("junk", ["not-an-ip", "", " , ", "1.2.3.4.5", "\x00", "a" * 5000, "unknown"])
def test_malformed_header_never_becomes_the_key(junk):
    assert client_ip(_request(xff=junk), trusted_hops=1) == "10.0.0.9"


def test_forms_of_one_address_are_one_key():
    assert normalize("::ffff:192.0.2.1") == "192.0.2.1"
    assert normalize("192.0.2.1:5678") == "192.0.2.1"
    assert normalize("[2001:DB8::0001]:443") == "2001:db8::1"
    assert normalize("fe80::1%eth0") == "fe80::1"
    assert normalize("garbage") is None


def test_asgi_headers_and_django_request_agree():
    headers = [(b"host", b"x"), (b"x-forwarded-for", b"1.1.1.1"), (b"X-Forwarded-For", b"203.0.113.7")]
    scope = {"type": "http", "headers": headers, "client": ("10.0.0.9", 5555)}
    assert client_ip_from_scope(scope, trusted_hops=1) == "203.0.113.7"
    assert client_ip(headers, "10.0.0.9", trusted_hops=2) == "1.1.1.1"
    assert client_ip_from_scope(scope, trusted_hops=0) == "10.0.0.9"
    assert client_ip(_request(xff="1.1.1.1,203.0.113.7"), trusted_hops=1) == client_ip_from_scope(scope, trusted_hops=1)


def test_scope_without_a_client_is_empty_not_an_error():
    assert client_ip_from_scope({"type": "http", "headers": []}) == ""


def test_setting_is_the_default(settings):
    settings.TESSERA_TRUSTED_PROXY_HOPS = 1
    assert client_ip(_request(xff="203.0.113.7")) == "203.0.113.7"
    settings.TESSERA_TRUSTED_PROXY_HOPS = 0
    assert client_ip(_request(xff="203.0.113.7")) == "10.0.0.9"
