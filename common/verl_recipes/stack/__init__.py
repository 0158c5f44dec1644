"""The pinned software stack: the pins, the lock, the images' checks, `verify` and the wheelhouse.

The pins, the lock and the image checks import only the standard library: the image builds run
them before anything is installed.
"""
