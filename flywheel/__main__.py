"""``python -m flywheel`` runs the command line."""

import sys

from flywheel.cli import main

sys.exit(main())
