"""``python -m dra_driver`` runs the same CLI as the ``dra-driver`` console script."""

import sys

from dra_driver.cli import main

sys.exit(main())
