"""Data shipped with gpucert: hardware profiles and run configs (YAML). Holds no code."""
