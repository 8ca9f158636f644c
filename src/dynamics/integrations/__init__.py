"""DynaMiCS inside other training loops: the transformers Trainer (and TRL's trainers)."""

from dynamics.integrations.trainer import DynamicsCallback, MixtureTrainSource

__all__ = ["DynamicsCallback", "MixtureTrainSource"]
