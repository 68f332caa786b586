"""`gpucert launch`: one command instead of hand-written job scripts.

- presets.py   network presets (configs/network-presets.yaml) as environment variables
- slurm.py     the sbatch script from a dataclass, submission, following the job to its report's verdict
- torchrun.py  the exact per-node commands for clusters without a scheduler
- k8s.py       an indexed Job with a headless Service
"""
