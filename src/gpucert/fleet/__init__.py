"""gpucert in the operator's systems: Prometheus metrics, node-problem-detector, each node's history."""
