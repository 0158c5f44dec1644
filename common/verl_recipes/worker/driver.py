"""The launcher's entry point: verl's ``main_ppo`` with the fixes that act in the driver.

``python -m verl_recipes.worker.driver --config-path RUN_DIR --config-name verl_config`` runs
verl 0.9.1's own Hydra ``main`` on the same arguments ``python -m verl.trainer.main_ppo`` takes.
The Ray worker hook (`verl_recipes.worker.hooks`) reaches every process Ray starts, but not the
driver, where verl calls ``ray.init``; this module registers the same fixes there first
(`verl_fixes.apply`, with ``VERL_RECIPES_NO_FIXES`` and ``VERL_RECIPES_FIXES_OFF`` read as in the
workers), so the one that patches ``main_ppo`` (``ray-local-start``) applies when it is imported; a rank
rehearsal (`verl_recipes.worker.rank_rehearsal`) gives the driver the rank's share of the job.
"""

from __future__ import annotations

import os

from verl_recipes.worker import rank_rehearsal, verl_fixes
from verl_recipes.worker.hooks import ENV_NO_FIXES


def main() -> None:

    rank_rehearsal.apply()
    if os.environ.get(ENV_NO_FIXES) != "1":
        verl_fixes.apply()
    from verl.trainer import main_ppo

    main_ppo.main()


if __name__ == "__main__":
    main()
