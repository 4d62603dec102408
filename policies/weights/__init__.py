"""Weights versions and where they live: on disk (the base model and each version), in the bus's object store,
in memory shared between engines, and the LIVE pointer in the bus's key-value bucket."""
