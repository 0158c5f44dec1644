"""`python -m verl_recipes.cluster`: the Slurm launcher's command line (verl_recipes.cluster.cli)."""

import sys

from verl_recipes.cluster.cli import main

sys.exit(main())
