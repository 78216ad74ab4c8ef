from django.conf import settings
from django.db import models


class OIDCIdentity(models.Model):
    """A person at an identity provider: (issuer, sub) is the only thing a sign-in is matched on.

    Email is not: an address can be re-assigned, unverified, or typed into a provider's profile by
    anyone, and matching on it would hand an existing account to whoever presents it.
    """

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_identity")
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)
    last_login_at = models.DateTimeField(null=True, blank=True)
    # The roles the last sign-in mapped to, for the admin's list (the groups are what is enforced).
    last_roles = models.JSONField(default=list, blank=True)

    class Meta:
        verbose_name = "OpenID Connect identity"
        verbose_name_plural = "OpenID Connect identities"
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="sso_identity_issuer_subject")]

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"

