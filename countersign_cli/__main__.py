"""``python -m countersign``: the command line."""

import sys

from countersign_cli.main import main

sys.exit(main())
