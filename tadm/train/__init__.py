"""Training: one loop (`trainer`), one class per method (`methods`), checkpoints (`checkpoint`)."""
