"""Training one lab run: its method and settings, GRPO through the slime hooks, and the run's summary."""
