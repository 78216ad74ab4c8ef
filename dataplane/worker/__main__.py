from dataplane.worker.entry import main

raise SystemExit(main())
