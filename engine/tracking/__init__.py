"""What a run reports: the experiment trackers on the right ranks (`TrackerHub`) and the torch profiler."""
