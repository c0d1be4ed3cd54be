"""chute.datasets."""
