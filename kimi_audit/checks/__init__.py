"""Checks: pure functions from a loaded Checkpoint (and its expected layout) to Findings."""
