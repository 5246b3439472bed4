"""Test and benchmark helpers that ship with the package (like torch.testing): a seeded random
request schedule and its driver (schedule.py)."""
