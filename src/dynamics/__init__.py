"""dynamics: fine-tune language models on a dynamic data mixture under performance constraints.

The method is DynaMiCS (docs/method.md): short rolled-back probing runs measure how each
fine-tuning dataset moves every evaluation loss, a linear (or fitted-curve) predictor extrapolates
the next stretch of training, and a small simplex problem picks the mixture that improves the
targets while keeping every constrained domain at or below the base model's level.
"""

__version__ = "0.1.0"
