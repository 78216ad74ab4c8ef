"""The doors people come in by: admin lockout (django-axes), two-factor for staff (django-otp TOTP),
and the security headers of the admin, the management API and the gateway (docs/controlplane.md,
"The doors: lockout, two-factor, headers")."""
