"""`gpucert evaluate`: the held-out suite (evaluate.py: batched greedy generation, tool-call parsing, turn
scoring, after BFCL's AST checker in checker.py), BFCL's own categories (bfcl.py), and the results judged against
eval.thresholds as a gpucert report (report.py). Nothing here imports torch at import time: the CLI reads its
options (bfcl.add_suite_arguments) for --help."""
