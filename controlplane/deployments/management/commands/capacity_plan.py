"""`manage.py capacity_plan --deployment D --rps R --prompt-tokens P --output-tokens O [--tier T]
[--ttft-ms X --itl-ms Y] [--worker-class C] [--curve FILE] [--overhead-ms M] [--json]`: the replicas
that hold the targets at that load, per worker class with a measured load curve, and what the tokens
cost at that size (controlplane/deployments/capacity/)."""

from __future__ import annotations

import json
from dataclasses import asdict
from decimal import Decimal

from django.core.management.base import BaseCommand, CommandError

from common.errors import ApplicationError

from ...capacity.service import capacity_plan, targets_for


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise ValueError(text) from None
        if not value > 0:
            raise ValueError(text)
        return value
    parse.__name__ = kind.__name__
    return parse


class Command(BaseCommand):
    help = "Replicas needed to hold a tier's TTFT and ITL p95 targets at a load, and the $/M tokens at that size."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--deployment", help="whose measured load curves to plan with")
        parser.add_argument("--rps", type=_positive(float), required=True, help="requests per second, whole fleet")
        parser.add_argument("--prompt-tokens", type=_positive(int), required=True)
        parser.add_argument("--output-tokens", type=_positive(int), required=True)
        parser.add_argument("--tier", help="whose SLO targets to hold (default: the strictest tier's)")
        parser.add_argument("--ttft-ms", type=_positive(float), help="TTFT p95 target, overrides the tier's")
        parser.add_argument("--itl-ms", type=_positive(float), help="ITL p95 target, overrides the tier's")
        parser.add_argument("--worker-class", help="plan for this class only")
        parser.add_argument("--curve", help="a load curve file (a worker's GET /load_curve) instead of the database")
        parser.add_argument("--overhead-ms", type=float, default=0.0,
                            help="what the path before the engine adds to each TTFT (gateway, network)")
        parser.add_argument("--json", action="store_true", dest="as_json")

    def handle(self, *args, deployment, rps, prompt_tokens, output_tokens, tier, ttft_ms, itl_ms, worker_class,
               curve, overhead_ms, as_json: bool, **options) -> None:
        if not deployment and not curve:
            raise CommandError("give --deployment (its measured curves) or --curve FILE")
        data = None
        if curve:
            try:
                with open(curve, encoding="utf-8") as f:
                    data = json.loads(f.read())
            except (OSError, ValueError) as exc:
                raise CommandError(f"--curve: {exc}") from None
        try:
            targets, source = targets_for(tier=tier, ttft_ms=ttft_ms, itl_ms=itl_ms)
            plans = capacity_plan(deployment=deployment, rps=rps, prompt_tokens=prompt_tokens,
                                  output_tokens=output_tokens, targets=targets, worker_class=worker_class,
                                  curve=data, overhead_ms=overhead_ms)
        except ApplicationError as exc:
            raise CommandError(exc.message) from None
        if as_json:
            self.stdout.write(json.dumps([asdict(p) for p in plans], indent=2,
                                         default=lambda v: str(v) if isinstance(v, Decimal) else v))
            return
        w = self.stdout.write
        w(f"{rps:g} req/s of {prompt_tokens} prompt + {output_tokens} output tokens; targets from {source}: "
          f"TTFT p95 <= {targets.ttft_seconds * 1000:g} ms, ITL p95 <= {targets.itl_seconds * 1000:g} ms")
        w("worker class          replicas  per replica (max)   TTFT p95   ITL p95  busy   one fewer: TTFT / ITL    "
          "cost / hour   per M tokens")
        for cp in plans:
            p = cp.plan
            fewer = (f"{p.one_fewer.ttft_p95 * 1000:8.0f} / {p.one_fewer.itl_p95 * 1000:5.1f} ms"
                     + (" (queue grows)" if p.one_fewer.saturated else "")) if p.one_fewer else "-"
            cost = f"{p.hourly_cost:.2f} {p.currency}" if p.hourly_cost is not None else "unrated"
            per_m = f"{p.cost_per_million_tokens:.4f}" if p.cost_per_million_tokens is not None else "-"
            w(f"{cp.worker_class[:20]:20}  {p.replicas:8}  {p.rps / p.replicas:7.2f} ({p.replica_rps:6.2f})  "
              f"{p.at_plan.ttft_p95 * 1000:7.0f} ms  {p.at_plan.itl_p95 * 1000:5.1f} ms  {p.at_plan.utilisation:4.0%}  "
              f"{fewer:24}  {cost:>12}  {per_m:>12}")
        for cp in plans:
            if not cp.rated:
                w(f"note: {cp.worker_class} has no hourly rate (billing: worker class rates), so no cost")
        w("curves: " + ", ".join(f"{cp.worker_class} measured by {cp.measured_by} {cp.measured_at}".rstrip()
                                 for cp in plans))

