"""`python -m benchmarks.db_step STEP '<keyword arguments as JSON>'`: Django set up from the
environment, then benchmarks.db_setup's STEP called and its result printed as one JSON line."""

from __future__ import annotations

import json
import sys

import django


def main() -> None:
    step, kwargs = sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    django.setup()
    from benchmarks import db_setup  # after django.setup(): it imports models

    print(json.dumps(getattr(db_setup, step)(**kwargs)), flush=True)


if __name__ == "__main__":
    main()
