"""chute.gpu."""
