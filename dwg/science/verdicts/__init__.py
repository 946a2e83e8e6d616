"""Verdicts: the claims file, each claim's number and verdict, chance, the head's readouts, the claims across training
regimes, and across models and heads."""
