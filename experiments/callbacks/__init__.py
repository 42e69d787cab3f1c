"""The Lightning callbacks of a training run: atomic checkpoints, wall-time accounting, Optuna
pruning, plain progress lines for a log file. (The probing callback lives with the rest of the
probe code, in experiments/probing/.)"""
