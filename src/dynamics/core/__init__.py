"""Framework-free core of the method: numpy and scipy only (no torch import anywhere here)."""
