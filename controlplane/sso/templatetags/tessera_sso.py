from django import template
from django.urls import reverse

from controlplane.sso.config import password_login_enabled, sso_enabled

register = template.Library()


@register.simple_tag
def sso_login() -> dict:
    """What the admin sign-in page offers: the password form, the SSO button, or both."""
    return {"enabled": sso_enabled(), "password_login": password_login_enabled(), "url": reverse("sso-login")}
