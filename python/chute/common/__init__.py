"""chute.common."""
