"""What `Accelerator.prepare` wraps objects in: the optimizer and scheduler wrappers, unwrapping a model from its
wrappers, and the early refusal of what cannot be prepared (the preparer itself is `engine.accelerator.preparer`)."""
