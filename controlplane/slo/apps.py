from django.apps import AppConfig


class SLOConfig(AppConfig):
    name = "controlplane.slo"
    label = "slo"
    verbose_name = "SLO"
