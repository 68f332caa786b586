"""The data side of fine-tuning: rows read and repaired (glaive.py, formats.py), rendered with a chat template
and its assistant-only mask (template.py, tokenizer.py), packed (packing.py) and cached by fingerprint
(prepare.py); hub.py tells a local path from a hub id. The shipped assets (templates, the tiny tokenizer, the
Glaive-format sample) are in assets/."""
