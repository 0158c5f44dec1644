"""`verl-recipes wheelhouse`: the pinned stack as files for a host with no internet.

The GPU host can only receive files carried in the working tree, at most 64 MiB per transfer, and
already has most of the stack (torch, CUDA libraries). So we resolve the hashed lock for the
target's Python and platform (verl_recipes.stack.lock), drop what the target already has at the same
version (`--have`, its `pip freeze`), leave out what images/wheelhouse-excludes.toml says is not
needed (each with a reason), build sdist-only packages into pure-Python wheels here, and pack the
rest into one xz-compressed tar split into chunks. install.sh checks every chunk and every wheel
against sha256 sums embedded in it, and can gather chunks that arrive in separate transfers.

`--with GROUP` adds a versions.toml table that is not in the lock (e.g. [megatron] for recipe
70b-3d): its wheels come from PyPI for the target's tags, or, for entries marked `local_build`,
from `--local-wheels` (a wheel PyPI has only as an sdist, built elsewhere against the target's
Python and packages). install.sh installs each group in one `pip install --no-deps` call of its
own after the rest.
"""
