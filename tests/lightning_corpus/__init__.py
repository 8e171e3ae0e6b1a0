"""Lightning-style modules written the way Lightning users write them, with only their imports swapped to Ember.

Each module's ``main(workdir)`` trains for a few steps and returns what it observed (weights, metrics, logged
rows). ``tests/parity_scripts/record_corpus.py`` runs the very same source under lightning 2.6.6 after turning
the imports back (``trainer`` -> ``lightning.pytorch``, ``callbacks`` -> ``lightning.pytorch.callbacks``, ...)
and writes what Lightning observed to ``expected.py``; ``tests/trainer/test_lightning_corpus.py`` compares.
"""
