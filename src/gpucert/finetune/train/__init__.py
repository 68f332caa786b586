"""Training: the run (run.py: the command line, the job, a failure; `python -m gpucert.finetune.train` runs it),
the loop (loop.py) and its step (step.py), what it measured (summary.py, metrics.py, report.py), and what the loop
stands on: the memory plan (memory_plan.py), DDP/FSDP2 (parallel.py), checkpoints (checkpoint.py), the run
directory (rundir.py) and the compile cache (compile_cache.py)."""
