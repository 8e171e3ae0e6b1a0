"""The checkpoint path below the Accelerator's `Checkpointer` (`engine.accelerator.checkpointer`): what a checkpoint
captures and reads, the files and folders it writes and commits atomically, checksums, and asynchronous saves."""
