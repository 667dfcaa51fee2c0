"""`python -m rubberband` runs the CLI."""

import sys

from rubberband.cli.main import main

sys.exit(main())
