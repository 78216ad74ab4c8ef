"""The admin site: Django's, with the two-step sign-in and the second factor required where the policy says."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from . import twofactor
from .views import code_step, enrol_step, password_step


class TesseraAdminSite(admin.AdminSite):
    def has_permission(self, request) -> bool:
        # A session without its second factor sees the admin as if signed out (it is sent to sign in).
        return super().has_permission(request) and twofactor.second_factor_ok(request)

    def login(self, request, extra_context=None):
        return password_step(self, request, extra_context)

    def get_urls(self):
        return [
            path("login/code/", code_step(self), name="login_code"),
            path("login/enrol/", enrol_step(self), name="login_enrol"),
            *super().get_urls(),
        ]
