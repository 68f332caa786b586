"""`python -m gpucert ...` runs the CLI; torchrun needs a module to start (`torchrun -m gpucert ...`)."""

from gpucert.cli import main

raise SystemExit(main())
