"""What one management-API call costs when the operator signs in with HTTP Basic: the full password
check (Django's PBKDF2, a million iterations, on every call) against a remembered verification
(controlplane/doors/basic_cache.py), in one run, calls interleaved.

    python -m benchmarks.api_basic_auth [--calls 20]

In process, through Django's test client (GET /api/v1/tiers/, a superuser), on a throwaway SQLite
database with the production password hasher (the test settings' MD5 would hide the cost). CPU
time per call is the process's, which is what the control plane's cores spend.
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings.test")
    os.environ["TESSERA_TEST_DATABASE"] = "sqlite"
    import django

    django.setup()
    from django.conf import global_settings, settings
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import setup_test_environment

    from benchmarks.common import _cpu_name, write_results
    from controlplane.doors import basic_cache

    setup_test_environment()
    connection.creation.create_test_db(verbosity=0)
    settings.PASSWORD_HASHERS = global_settings.PASSWORD_HASHERS  # PBKDF2, as in production
    User.objects.create_superuser("ops", "ops@example.com", "right-password")
    token = base64.b64encode(b"ops:right-password").decode()
    client = Client()

    def call() -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        assert client.get("/api/v1/tiers/", HTTP_AUTHORIZATION=f"Basic {token}", REMOTE_ADDR="198.51.100.9").status_code == 200
        return (time.perf_counter() - wall) * 1e3, (time.process_time() - cpu) * 1e3

    call()  # warm: imports, the first query
    full, remembered = [], []
    for _ in range(args.calls):
        basic_cache.forget_all()
        full.append(call())
        remembered.append(call())  # right after a verified call: remembered
    connection.creation.destroy_test_db(connection.settings_dict["NAME"], verbosity=0)

    def summary(rows):
        return {"wall_ms_median": statistics.median(r[0] for r in rows),
                "cpu_ms_median": statistics.median(r[1] for r in rows)}

    data = {"cpu": _cpu_name(), "when": time.strftime("%Y-%m-%d %H:%M"), "calls": args.calls,
            "hasher": settings.PASSWORD_HASHERS[0], "full_check": summary(full), "remembered": summary(remembered)}
    ratio = data["full_check"]["cpu_ms_median"] / max(data["remembered"]["cpu_ms_median"], 1e-6)
    data["cpu_ratio"] = ratio
    table = "\n".join([
        f"# Management API, HTTP Basic: full password check vs remembered ({data['cpu']}, {data['when']})",
        "",
        f"`python -m benchmarks.api_basic_auth --calls {args.calls}`: GET /api/v1/tiers/ as a superuser, "
        "Django's test client, SQLite, the production hasher; medians.",
        "",
        "| | wall ms / call | CPU ms / call |",
        "|---|---:|---:|",
        f"| full check (PBKDF2 every call) | {data['full_check']['wall_ms_median']:.1f} | {data['full_check']['cpu_ms_median']:.1f} |",
        f"| remembered (doors/basic_cache.py) | {data['remembered']['wall_ms_median']:.1f} | {data['remembered']['cpu_ms_median']:.1f} |",
        f"| **ratio** | | **{ratio:.0f}×** |",
    ])
    write_results("api_basic_auth", data, table)
    print(table)


if __name__ == "__main__":
    main()
