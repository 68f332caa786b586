"""`gpucert cluster ...`: checks of the cluster around the GPUs (Slurm itself; later the shared filesystem and
bad-node localization)."""
