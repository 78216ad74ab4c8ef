from django.urls import path

from controlplane.sso.views import SSOCallbackView, SSOLoginView

# The callback's absolute URL (https://<host>/sso/callback/) is the redirect URI to register at the provider.
urlpatterns = [
    path("login/", SSOLoginView.as_view(), name="sso-login"),
    path("callback/", SSOCallbackView.as_view(), name="sso-callback"),
]
