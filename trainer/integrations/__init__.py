"""Integrations with the engines that start and restart training processes (``trainer.integrations.ray``).

Each is imported on its own, so ``import trainer`` never imports their dependencies.
"""
