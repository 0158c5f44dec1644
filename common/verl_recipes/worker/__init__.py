"""What runs inside verl's Ray workers: the setup hook, the verl fixes, the phase markers.

Nothing here imports torch or verl at import time: Ray runs the hook before it sets the worker's
CUDA_VISIBLE_DEVICES.
"""
