"""The distributed runtime under bench, health and finetune: who this process is in the job, which GPU it
drives, how the job's processes meet, and how a failure anywhere ends the job everywhere with the culprit named.

- launch_env.py  the launcher's environment (torchrun, srun, a Kubernetes indexed job, gpucert's own agent)
- identity.py    a rank's name: global/local/node rank, node label, host, GPU UUID and NVML index
- device.py      the CUDA ordinal to bind, correct under `srun --gpus-per-task` and `--gpu-bind`
- group.py       the job's store, the rendezvous that names missing ranks, the process group, abort records
- watchdog.py    heartbeats per node: a stopped or dead rank is named and every rank exits
- open_files.py  the open-file limit of the process that serves the job's store
- spawn.py       local workers in their own process groups, TERM then KILL, no orphans
- agent.py       one gpucert per node starting its GPUs' workers, node rendezvous, steps run across nodes
"""
