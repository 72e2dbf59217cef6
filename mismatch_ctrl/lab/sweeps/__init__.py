"""Sweeps of lab runs: options, planning, run folders and their integrity, locks, budgets, executors, progress, and the
``mismatch-ctrl lab`` pipeline."""
