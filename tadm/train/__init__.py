"""Training: one loop (`trainer`), the objective of each method from its unit (`tadm.methods`), checkpoints (`checkpoint`)."""
