"""GPU and node health checks: judges of the inventory against a profile."""
