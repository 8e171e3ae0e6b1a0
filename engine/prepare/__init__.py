"""What `Accelerator.prepare` hands back and keeps: the registry of prepared objects, the optimizer and
scheduler wrappers, unwrapping, and the early refusal of what cannot be prepared."""
