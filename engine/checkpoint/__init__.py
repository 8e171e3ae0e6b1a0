"""The checkpoint path: the Accelerator's checkpointer (save_state / load_state / save / save_model), what it
captures and reads, the files and folders it writes and commits atomically, and asynchronous saves."""
