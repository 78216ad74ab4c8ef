"""The Stripe webhook endpoint: verify the signature over the raw body, then apply the event once."""

from __future__ import annotations

import json
import logging

import stripe
from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from billing.services import stripe_event_process

logger = logging.getLogger("tessera.billing")
DEFAULT_TOLERANCE_SECONDS = 300  # Stripe's own default: a signed timestamp older than 5 minutes is refused


@csrf_exempt
@require_POST
def stripe_webhook(request: HttpRequest) -> JsonResponse:
    secret = getattr(settings, "STRIPE_WEBHOOK_SECRET", "")
    if not secret:
        return JsonResponse({"detail": "Stripe webhooks are not configured.", "code": "not_configured"}, status=503)
    payload = request.body
    try:
        # HMAC-SHA256 over "<timestamp>.<raw body>" with the endpoint secret, timestamp within tolerance.
        stripe.Webhook.construct_event(
            payload.decode("utf-8"),
            request.headers.get("Stripe-Signature"),
            secret,
            tolerance=getattr(settings, "STRIPE_WEBHOOK_TOLERANCE", DEFAULT_TOLERANCE_SECONDS),
        )
        event = json.loads(payload)
    except (ValueError, UnicodeDecodeError, stripe.SignatureVerificationError) as exc:
        logger.warning("stripe webhook refused", extra={"reason": type(exc).__name__})
        return JsonResponse({"detail": "Invalid Stripe signature or payload.", "code": "invalid_signature"}, status=400)
    if not isinstance(event, dict) or not event.get("id"):
        return JsonResponse({"detail": "Event without an id.", "code": "invalid_payload"}, status=400)
    row, applied = stripe_event_process(event=event)
    return JsonResponse({"received": True, "replayed": not applied, "outcome": row.outcome})
