"""chute.stream."""
