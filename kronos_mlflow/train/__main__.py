import sys

from ..training.run import cli

sys.exit(cli())
