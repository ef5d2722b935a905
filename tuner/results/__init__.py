"""Stored results: the storage (the one Optuna adapter with private names), studies, trial queries."""
