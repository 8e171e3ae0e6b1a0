"""Fitting in memory: retrying with a smaller batch on out-of-memory, and activation checkpointing."""
