"""Starting processes: `ember launch` over torchrun (`python -m engine.launch`), its settings, in-Python
launchers (notebook / debug), the elastic store and the watch that ends workers whose launcher died."""
