"""Training token sources, each addressed by global sample index (see raytrain.core.batching)."""
