"""Training on the workers: the per-worker loop, checkpoints, progress, and the Ray launcher."""
