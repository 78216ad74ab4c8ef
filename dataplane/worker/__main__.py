from dataplane.worker.server import main

raise SystemExit(main())
