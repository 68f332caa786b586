"""LoRA supervised fine-tuning for function calling: data, model, parallel training loop, evaluation."""
