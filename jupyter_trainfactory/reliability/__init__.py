"""Reliability of a fleet: failure kinds, the failure log of a run, and the report over runs."""
