"""`python -m gpucert.finetune.train CONFIG [--set KEY.PATH=VALUE] [--resume auto]`: one rank of `gpucert
finetune` (torchrun and srun start one per GPU). run.py's docstring says how to run it and read the output."""

import sys

from gpucert.bytecode import use_cache

use_cache()  # before torch is imported: bytecode.py says why
from gpucert.finetune.train.run import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
