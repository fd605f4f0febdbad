"""What one process keeps beside its connections: owner ids, fork hooks, holders."""
