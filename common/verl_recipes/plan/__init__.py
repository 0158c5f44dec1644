"""The planner's evidence and its command: `verl-recipes plan`.

The model (`verl_recipes.predict`) predicts from a configuration alone; this wing holds it
against what was measured. `runs` reads the committed measured runs; `errors` and `host_runs`
compare the device and host predictions with them; `layers` calibrates a full-depth prediction
from truncated-depth runs; `rank_check` compares a rehearsed rank with the run it stands for;
`evidence` says what stands behind a multi-GPU figure; `advice` gives the one verdict a recipe
gets (planner, calibrated prediction or measured run) and what to change; `cli` is the command.
"""
