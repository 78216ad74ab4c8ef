"""`python -m benchmarks.child MODULE:FUNCTION '<keyword arguments as JSON>'`: FUNCTION called in this fresh
process and its result printed as one JSON line.

For measurements that need a process of their own (torch's threads set before any work, environment flags
read at import, no state left by the parent): the code is an importable function, not a `python -c`
string; `benchmarks.common.run_child` starts it. Django steps have their own door (benchmarks.db_step).
"""

from __future__ import annotations

import importlib
import json
import sys


def main() -> None:
    target, kwargs = sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    module, _, function = target.partition(":")
    result = getattr(importlib.import_module(module), function)(**kwargs)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
