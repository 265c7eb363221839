import sys

from ..cli.train_predictor import cli

sys.exit(cli())
