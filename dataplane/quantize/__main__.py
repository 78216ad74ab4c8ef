import sys

from dataplane.quantize.make import main

sys.exit(main())
