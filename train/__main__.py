"""`python -m train ...`: see train/cli/__init__.py."""

import logging
import sys

# before any library import: absl (through orbax) configures the root logger on its first
# message otherwise, and `main`'s own basicConfig would then be a no-op
logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")

from train.cli.entry import main  # noqa: E402

sys.exit(main())
