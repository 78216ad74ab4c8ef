"""The admin's sign-in in two steps: the password (under the lockout), then the code or the enrolment.

Between the steps nothing is logged in: the session only remembers, for PENDING_SECONDS, which user
passed the password. So a password alone never yields a session that the admin, the management API
(session authentication) or anything else would accept.
"""

from __future__ import annotations

import time

import django_otp
import qrcode
import qrcode.image.svg
from axes.handlers.proxy import AxesProxyHandler
from django.contrib import auth
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import REDIRECT_FIELD_NAME
from django.contrib.auth.signals import user_login_failed
from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.safestring import mark_safe
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_protect
from django.views.decorators.debug import sensitive_post_parameters
from django_otp.plugins.otp_totp.models import TOTPDevice

from . import conf, metrics, twofactor
from .responses import lockout_response

PENDING_KEY = "tessera_second_factor_pending"
PENDING_SECONDS = 300


def _pending_start(request: HttpRequest, user, next_url: str) -> None:
    request.session.cycle_key()
    request.session[PENDING_KEY] = {"uid": user.pk, "backend": getattr(user, "backend", None),
                                    "at": time.time(), "next": next_url}


def _pending_user(request: HttpRequest):
    pending = request.session.get(PENDING_KEY)
    if not isinstance(pending, dict) or time.time() - float(pending.get("at", 0)) > PENDING_SECONDS:
        request.session.pop(PENDING_KEY, None)
        return None, None
    user = auth.get_user_model().objects.filter(pk=pending.get("uid"), is_active=True, is_staff=True).first()
    return user, pending


def _safe_next(request: HttpRequest, url: str | None, site) -> str:
    if url and url_has_allowed_host_and_scheme(url, allowed_hosts={request.get_host()},
                                               require_https=request.is_secure()):
        return url
    return reverse("admin:index", current_app=site.name)


def _finish(request: HttpRequest, user, device, pending: dict) -> None:
    if not (request.user.is_authenticated and request.user.pk == user.pk):
        auth.login(request, user, backend=pending.get("backend") or "django.contrib.auth.backends.ModelBackend")
    django_otp.login(request, device)
    request.session.pop(PENDING_KEY, None)


def _code_refused(request: HttpRequest, user, reason: str) -> HttpResponse | None:
    """Count a wrong code as a failed sign-in (axes may lock the user out: then its response)."""
    metrics.on_second_factor_failed(request=request, username=user.get_username(), reason=reason)
    user_login_failed.send(sender=__name__, credentials={"username": user.get_username()}, request=request)
    if getattr(request, "axes_locked_out", False):
        request.session.pop(PENDING_KEY, None)
        return lockout_response(request, None, {"username": user.get_username()})
    return None


def _locked(request: HttpRequest, user) -> HttpResponse | None:
    credentials = {"username": user.get_username()}
    if AxesProxyHandler.is_allowed(request, credentials):
        return None
    request.session.pop(PENDING_KEY, None)
    return lockout_response(request, None, credentials)


class PasswordStepView(LoginView):
    """Django's admin login, except that a user who needs a second factor goes on to the code step."""

    authentication_form = AdminAuthenticationForm
    template_name = "admin/login.html"
    admin_site = None

    def form_valid(self, form):
        user = form.get_user()
        if twofactor.requires_second_factor(user):
            _pending_start(self.request, user, self.get_redirect_url())  # "" when unsafe: the admin's index
            name = "login_code" if twofactor.user_has_device(user, confirmed=True) else "login_enrol"
            return HttpResponseRedirect(reverse(f"admin:{name}", current_app=self.admin_site.name))
        return super().form_valid(form)


def password_step(site, request: HttpRequest, extra_context=None) -> HttpResponse:
    if request.method == "GET" and site.has_permission(request):
        return HttpResponseRedirect(reverse("admin:index", current_app=site.name))
    user = request.user
    if request.method == "GET" and user.is_authenticated and user.is_staff and not twofactor.second_factor_ok(request):
        # Signed in some other way (an older session, single sign-on without MFA): ask for the code now.
        _pending_start(request, user, request.GET.get(REDIRECT_FIELD_NAME, ""))
        name = "login_code" if twofactor.user_has_device(user, confirmed=True) else "login_enrol"
        return HttpResponseRedirect(reverse(f"admin:{name}", current_app=site.name))
    context = {**site.each_context(request), "title": "Log in", "subtitle": None,
               "app_path": request.get_full_path(), "username": user.get_username()}
    if REDIRECT_FIELD_NAME not in request.GET and REDIRECT_FIELD_NAME not in request.POST:
        context[REDIRECT_FIELD_NAME] = reverse("admin:index", current_app=site.name)
    context.update(extra_context or {})
    request.current_app = site.name
    return PasswordStepView.as_view(extra_context=context, admin_site=site,
                                    authentication_form=site.login_form or AdminAuthenticationForm)(request)


def _render(site, request, template: str, context: dict, status: int = 200) -> HttpResponse:
    return render(request, template, {**site.each_context(request), **context}, status=status)


def code_step(site):
    @never_cache
    @csrf_protect
    @sensitive_post_parameters("code")
    def view(request: HttpRequest) -> HttpResponse:
        user, pending = _pending_user(request)
        if user is None:
            return HttpResponseRedirect(reverse("admin:login", current_app=site.name))
        if not twofactor.user_has_device(user, confirmed=True):
            return HttpResponseRedirect(reverse("admin:login_enrol", current_app=site.name))
        refused = _locked(request, user)
        if refused:
            return refused
        error = None
        if request.method == "POST":
            device, throttled = twofactor.verify_code(user, request.POST.get("code", ""))
            if device is not None:
                _finish(request, user, device, pending)
                return HttpResponseRedirect(_safe_next(request, pending.get("next"), site))
            reason = "throttled" if throttled else "wrong_code"
            refused = _code_refused(request, user, reason)
            if refused:
                return refused
            error = ("Too many wrong codes: wait a few seconds and try again." if reason == "throttled"
                     else "That code is not right. Enter the 6-digit code from the authenticator app, or a recovery code.")
        return _render(site, request, "doors/code.html", {"title": "Authentication code", "error": error,
                                                          "username": user.get_username()},
                       status=400 if error else 200)

    return view


def _qr_svg(uri: str) -> str:
    image = qrcode.make(uri, image_factory=qrcode.image.svg.SvgPathImage, box_size=8)
    return image.to_string(encoding="unicode")


def enrol_step(site):
    @never_cache
    @csrf_protect
    @sensitive_post_parameters("code")
    def view(request: HttpRequest) -> HttpResponse:
        user, pending = _pending_user(request)
        if user is None:
            return HttpResponseRedirect(reverse("admin:login", current_app=site.name))
        if twofactor.user_has_device(user, confirmed=True):
            return HttpResponseRedirect(reverse("admin:login_code", current_app=site.name))
        context = {"title": "Set up two-factor sign-in", "username": user.get_username(), "error": None}
        if not conf.self_enrol():
            context["operator_only"] = True
            return _render(site, request, "doors/enrol.html", context, status=403)
        refused = _locked(request, user)
        if refused:
            return refused
        device = None
        if request.method == "POST":  # the device this session was shown, if it is still the pending one
            device = TOTPDevice.objects.filter(pk=pending.get("device"), user=user, confirmed=False).first()
        if device is None:
            if request.method == "POST":  # replaced by another enrolment page for this user meanwhile
                context["error"] = "The key shown before was replaced by another sign-in: scan this one."
                metrics.log.warning("enrolment key replaced", extra={"event": "enrolment_key_replaced",
                                                                     "username": user.get_username()})
            device = twofactor.enrolment_start(user)
            pending["device"] = device.pk
            request.session[PENDING_KEY] = pending
        elif request.method == "POST":
            codes = twofactor.enrolment_confirm(device, request.POST.get("code", ""))
            if codes is not None:
                device.refresh_from_db()
                _finish(request, user, device, pending)
                return _render(site, request, "doors/recovery_codes.html", {
                    "title": "Recovery codes", "codes": codes,
                    "next": _safe_next(request, pending.get("next"), site)})
            refused = _code_refused(request, user, "wrong_enrolment_code")
            if refused:
                return refused
            context["error"] = "That code is not right: enter the 6 digits the app shows now."
        secret = device.config_url.split("secret=", 1)[1].split("&", 1)[0]
        context.update({"qr_svg": mark_safe(_qr_svg(device.config_url)), "otpauth_uri": device.config_url,
                        "secret": secret})
        return _render(site, request, "doors/enrol.html", context, status=400 if context["error"] else 200)

    return view
