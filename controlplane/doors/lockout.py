"""Sign-in lockout: django-axes with its database handler, counting per username and per client address.

Policy: after TESSERA_LOGIN_FAILURE_LIMIT failures (per username, and separately per address, summed
over every row axes keeps) the key is locked for TESSERA_LOGIN_COOLOFF_SECONDS. Failures are
remembered until TESSERA_LOGIN_COOLOFF_MAX_SECONDS after the last one, so once a lockout ends each
further failure locks again at once, for twice as long (capped at the maximum): a patient attacker
gets one guess per cool-down and the cool-downs grow, a person who mistyped five times waits five
minutes. Attempts refused during a lockout are not recorded (they neither extend it nor grow it), so
the owner retrying the right password does not punish themself. A successful sign-in forgets only
that username's failures from that address: logging in to one's own account must not wipe the
count an address built up against someone else's.

axes' stock handler applies one cool-off to every row (and deletes rows older than it on every
attempt); this subclass makes the cool-off depend on each key's own failure count.
"""

from __future__ import annotations

import ipaddress
import logging
from datetime import datetime, timedelta

from axes.handlers.database import AxesDatabaseHandler
from axes.helpers import get_client_parameters, get_client_username
from axes.models import AccessAttempt, AccessLog
from django.db.models import Max, Q, QuerySet, Sum
from django.http import HttpRequest
from django.utils import timezone

from common.client_ip import client_ip

from . import conf

log = logging.getLogger("tessera.doors")

USERNAME_MAX = 255  # axes' column; a longer name must not become a database error (a 500)


def failure_limit(request: HttpRequest | None = None, credentials: dict | None = None) -> int:
    """AXES_FAILURE_LIMIT, read from TESSERA_LOGIN_FAILURE_LIMIT at each attempt."""
    return conf.failure_limit()


def cool_off_for(failures: int) -> timedelta:
    """The lockout that `failures` failures earn: the base at the limit, doubling per failure past it."""
    base, most = conf.cooloff_base(), conf.cooloff_max()
    extra = max(failures - conf.failure_limit(), 0)
    if extra >= 40:  # 2**40 x any base is past any maximum; avoid huge timedeltas
        return most
    return min(base * (2 ** extra), most)


def username_for_axes(request: HttpRequest, credentials: dict | None) -> str | None:
    """AXES_USERNAME_CALLABLE: the submitted username, made storable (no NUL, at most 255 characters)."""
    value = (credentials or {}).get("username")
    if value is None and request is not None and request.method == "POST":
        value = request.POST.get("username")
    if value is None:
        return None
    return str(value).replace("\x00", "")[:USERNAME_MAX]


def address_key(address: str | None) -> str | None:
    """The address a lockout counts under: IPv4 as is, IPv6 as its /64 (one host picks freely within it)."""
    if not address:
        return None
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None
    if ip.version == 6:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False).network_address)
    return str(ip)


def client_ip_for_axes(request: HttpRequest) -> str | None:
    """AXES_CLIENT_IP_CALLABLE: the shared client-address rule (TESSERA_TRUSTED_PROXY_HOPS), IPv6 per /64."""
    return address_key(client_ip(request))


def not_a_password_attempt(request: HttpRequest, credentials: dict | None) -> bool:
    """AXES_WHITELIST_CALLABLE: an OpenID Connect callback (a nonce, no password) is neither counted nor
    refused. It cannot be used to guess a password (state, nonce and PKCE are single-use), the
    identity provider runs its own lockout, and single sign-on stays open to people who share an
    address an attacker has locked."""
    credentials = credentials or {}
    return "nonce" in credentials and not credentials.get("password") and not credentials.get("username")


def _state(attempts: QuerySet) -> tuple[int, datetime | None]:
    row = attempts.aggregate(failures=Sum("failures_since_start"), last=Max("attempt_time"))
    return int(row["failures"] or 0), row["last"]


def signed_in_here(username: str | None, address: str | None) -> bool:
    """Whether `username` signed in successfully from `address` within the longest cool-off."""
    if not username or not address:
        return False
    since = timezone.now() - conf.cooloff_max()
    return AccessLog.objects.filter(username=username, ip_address=address, attempt_time__gte=since).exists()


def remember_sign_in(request: HttpRequest, username: str) -> None:
    """Log a successful sign-in that Django's `user_logged_in` does not announce (HTTP Basic on the API):
    a row when the username has none from this address in the last half of the longest cool-off, so
    one or two a day, not one per request (an indexed lookup per request instead)."""
    address = client_ip_for_axes(request)
    if not address or not username:
        return
    since = timezone.now() - conf.cooloff_max() / 2
    if not AccessLog.objects.filter(username=username, ip_address=address, attempt_time__gte=since).exists():
        AccessLog.objects.create(
            username=username[:USERNAME_MAX], ip_address=address,
            user_agent=request.META.get("HTTP_USER_AGENT", "")[:255],
            http_accept=request.META.get("HTTP_ACCEPT", "")[:1025], path_info=request.path[:255],
        )


def locked_until(request: HttpRequest, credentials: dict | None = None) -> datetime | None:
    """When the lockout that covers this request ends (the later of its username's and its address's); None if none."""
    username = get_client_username(request, credentials)
    address = getattr(request, "axes_ip_address", None) or client_ip_for_axes(request)
    if signed_in_here(username, address):
        address = None  # judged by its username alone
    until = None
    for keys in ({"username": username} if username is not None else None, {"ip_address": address} if address else None):
        if keys is None:
            continue
        failures, last = _state(AccessAttempt.objects.filter(**keys))
        if failures >= conf.failure_limit() and last is not None:
            end = last + cool_off_for(failures)
            if end > timezone.now() and (until is None or end > until):
                until = end
    return until


def cool_off(request: HttpRequest | None = None) -> timedelta:
    """AXES_COOLOFF_TIME: the length of the lockout this request is under (the base when none)."""
    if request is None:
        return conf.cooloff_base()
    until = locked_until(request, getattr(request, "axes_credentials", None))
    return (until - timezone.now()) if until else conf.cooloff_base()


class GrowingCoolOffHandler(AxesDatabaseHandler):
    """axes' database handler with a cool-off per key that grows with that key's failures."""

    def get_user_attempts(self, request: HttpRequest, credentials: dict | None = None) -> list[QuerySet]:
        now = getattr(request, "axes_attempt_time", None) or timezone.now()
        limit = conf.failure_limit()
        username = get_client_username(request, credentials)
        keys = get_client_parameters(username, request.axes_ip_address, request.axes_user_agent, request, credentials)
        known = signed_in_here(username, request.axes_ip_address)
        result = []
        for filters, attempts in zip(keys, self.filter_user_attempts(request, credentials), strict=True):
            if known and "username" not in filters:  # the address's count does not lock a user known there
                result.append(attempts.none())
                continue
            failures, last = _state(attempts)
            if failures < limit or (last is not None and last + cool_off_for(failures) > now):
                result.append(attempts)
            else:  # the lockout is over: remembered (for the next one's length), not counted
                result.append(attempts.none())
        return result

    def clean_expired_user_attempts(self, request: HttpRequest | None = None, credentials: dict | None = None) -> int:
        count, _ = AccessAttempt.objects.filter(attempt_time__lte=timezone.now() - conf.cooloff_max()).delete()
        return count

    def reset_user_attempts(self, request: HttpRequest, credentials: dict | None = None) -> int:
        username = get_client_username(request, credentials)
        count, _ = AccessAttempt.objects.filter(username=username, ip_address=request.axes_ip_address).delete()
        return count


def unlock(*, username: str | None = None, ip_address: str | None = None) -> int:
    """Forget the failures of a username and/or an address (both given: either matches); the rows removed."""
    if not username and not ip_address:
        raise ValueError("give a username or an address to unlock")
    wanted = Q(pk__in=[])
    if username:
        wanted |= Q(username=username)
    if ip_address:
        wanted |= Q(ip_address=ip_address)
    count, _ = AccessAttempt.objects.filter(wanted).delete()
    log.warning("login lockout cleared", extra={"event": "login_unlock", "username": username,
                                                 "ip_address": ip_address, "rows": count})
    return count
