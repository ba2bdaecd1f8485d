"""Tuning: recorded runs replayed over settings grids, and held-out splits."""
