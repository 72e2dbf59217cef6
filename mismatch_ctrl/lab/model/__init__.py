"""The lab's model and its engines: tasks, the tiny policy, quantisers, the rollout engine, routing, the discrepancy
floor, the supervised warm-up."""
