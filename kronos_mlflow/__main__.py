"""``python -m kronos_mlflow COMMAND ...`` is ``kronos-mlflow COMMAND ...`` (the MLproject's entry
points use it, so they run without the console script on ``PATH``)."""

import sys

from .cli.main import main

sys.exit(main())
