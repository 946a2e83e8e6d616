"""Verdicts: the claims file, each claim's number and verdict, chance, the head's readouts, and the claims across training
regimes."""
