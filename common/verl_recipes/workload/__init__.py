"""What a run trains on: bundled architectures, the synthetic checkpoint, the dataset, the reward."""
