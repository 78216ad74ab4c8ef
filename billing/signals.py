"""What billing's services announce once committed, so the layer above them (Celery tasks) acts on it
without the services importing the tasks."""

from django.dispatch import Signal

# Sent on commit when Stripe should hear of an invoice. kwargs: invoice_id (int), action ("sync" | "void").
stripe_push_wanted = Signal()
