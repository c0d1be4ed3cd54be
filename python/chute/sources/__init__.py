"""chute.sources."""
