"""The two SSO pages: send the browser to the provider, and take it back (state, nonce, PKCE: the library)."""

from __future__ import annotations

from django.conf import settings
from django.http import Http404, HttpResponseRedirect
from django.urls import reverse
from django.views.generic import View
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from controlplane.doors.twofactor import mark_verified_by_idp
from controlplane.sso.backends import report
from controlplane.sso.config import ProviderUnavailable, library_setting, provider, sso_enabled


class SSOLoginView(OIDCAuthenticationRequestView):
    get_settings = staticmethod(library_setting)

    def __init__(self, **kwargs):
        View.__init__(self, **kwargs)  # the library reads the provider here; we do it per request

    def get(self, request):
        if not sso_enabled():
            raise Http404("single sign-on is not configured")
        try:
            found = provider()
        except ProviderUnavailable:
            report(request, "The identity provider cannot be reached; try again later.")
            return HttpResponseRedirect(reverse("admin:login"))
        self.OIDC_OP_AUTH_ENDPOINT = found.authorization_endpoint
        self.OIDC_RP_CLIENT_ID = settings.TESSERA_OIDC_CLIENT_ID
        return super().get(request)


class SSOCallbackView(OIDCAuthenticationCallbackView):
    """A `state` this session did not issue is a SuspiciousOperation (400); a replayed one too."""

    get_settings = staticmethod(library_setting)

    @property
    def failure_url(self) -> str:
        return reverse("admin:login")

    @property
    def success_url(self) -> str:
        return self.request.session.get("oidc_login_next") or reverse("admin:index")

    def get(self, request):
        if not sso_enabled():
            raise Http404("single sign-on is not configured")
        if request.GET.get("error"):
            # The provider's own refusal (access_denied, ...): its code only, never its free text.
            report(request, f"The identity provider did not sign you in ({request.GET['error'][:64]}).")
        return super().get(request)

    def login_success(self):
        response = super().login_success()
        self.request.session.set_expiry(settings.TESSERA_OIDC_SESSION_SECONDS)
        if _provider_did_mfa(getattr(self.user, "sso_amr", [])):
            # The admin's two-factor rule (controlplane/doors) then asks this session for no TOTP code.
            mark_verified_by_idp(self.request)
        return response

    def login_failure(self):
        if not getattr(self.request, "sso_failure_reported", False):
            report(self.request, "Single sign-on did not complete; start again from the sign-in page.")
        return super().login_failure()


def _provider_did_mfa(amr: list) -> bool:
    """TESSERA_OIDC_MFA_AMR empty: the provider's sign-in policy is trusted to require MFA.

    Set (e.g. "mfa,otp,hwk"), the ID token's `amr` must name one of them, else the person is asked
    for this platform's own second factor as after a password.
    """
    wanted = set(settings.TESSERA_OIDC_MFA_AMR or [])
    if not wanted:
        return True
    return bool(wanted & {str(value) for value in (amr if isinstance(amr, list) else [amr])})
