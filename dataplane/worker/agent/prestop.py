"""Kubernetes preStop hook: `python -m dataplane.worker.agent.prestop --wait 60`.

Cordons this worker in the control plane (it gets nothing new) and waits until the replica it
serves has a ready replacement elsewhere (the reconciler then sends it `unload_model`), or until
`--wait` seconds pass. SIGTERM follows and drains the in-flight requests. Never fails the hook:
any error just ends the wait (termination must go on).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
import time

from .client import ControlPlaneClient, ControlPlaneRejected, ControlPlaneUnavailable


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dataplane.worker.agent.prestop")
    parser.add_argument("--wait", type=float, default=60.0, help="seconds to wait for replacements at most")
    parser.add_argument("--interval", type=float, default=2.0)
    args = parser.parse_args(argv)
    url = os.environ.get("TESSERA_CONTROL_PLANE_URL", "")
    if not url:
        return 0
    port = os.environ.get("TESSERA_WORKER_PORT", "8100")
    worker_id = os.environ.get("TESSERA_WORKER_ID") or re.sub(r"[^A-Za-z0-9._-]", "-", f"{socket.gethostname()}-{port}")
    client = ControlPlaneClient(url, worker_id, os.environ.get("TESSERA_INTERNAL_TOKEN", ""), timeout=5)
    deadline = time.monotonic() + args.wait
    try:
        while True:
            answer = client.drain()
            if not answer.get("waiting_for") or time.monotonic() >= deadline:
                print(f"prestop: {worker_id} cordoned; {answer.get('waiting_for', 0)} replica(s) still here",
                      file=sys.stderr)
                return 0
            time.sleep(args.interval)
    except (ControlPlaneUnavailable, ControlPlaneRejected) as exc:
        print(f"prestop: {exc}", file=sys.stderr)
        return 0
    finally:
        client.close()


if __name__ == "__main__":
    raise SystemExit(main())
