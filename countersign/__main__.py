"""``python -m countersign``: the command line."""

import sys

from countersign.cli.main import main

sys.exit(main())
