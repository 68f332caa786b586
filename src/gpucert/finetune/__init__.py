"""LoRA supervised fine-tuning for function calling, by room: data/ (rows to packed batches), model/ (the LoRA
model and its fast paths), train/ (one run: `python -m gpucert.finetune.train`), eval/ (`gpucert evaluate`);
config.py is the config tree, plan.py the run's plan (every lever decided once, with its reason), commands.py
the verbs."""
