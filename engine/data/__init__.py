"""The data path: sharding a DataLoader across processes, dispatching batches from rank 0, samplers, resumable
positions, worker seeding and look-ahead."""
