from django.contrib import admin

from controlplane.sso.models import OIDCIdentity


@admin.register(OIDCIdentity)
class OIDCIdentityAdmin(admin.ModelAdmin):
    """Who signs in through which provider account; read-only (sign-ins write it, roles come from the provider).

    Deleting one unlinks the account: that provider account's next sign-in makes a new user.
    """

    list_display = ("user", "subject", "issuer", "last_roles", "last_login_at", "created_at")
    list_filter = ("issuer",)
    search_fields = ("user__username", "subject")
    readonly_fields = ("user", "issuer", "subject", "last_roles", "last_login_at", "created_at")

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
