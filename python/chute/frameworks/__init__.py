"""chute inside the training frameworks (docs/frameworks.md). Nothing here
imports a framework until its own module is imported:
``chute.frameworks.hf_trainer`` (the transformers Trainer)."""
