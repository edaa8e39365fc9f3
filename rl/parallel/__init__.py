"""Training on one device or many: token-budget micro-batches, FSDP2 under torchrun."""
