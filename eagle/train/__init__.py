"""Training the EAGLE draft head: self-distilled data, the training loop, checkpoints."""
