"""chute.decoding."""
