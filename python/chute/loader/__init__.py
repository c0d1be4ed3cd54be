"""chute.loader."""
