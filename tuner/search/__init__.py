"""The tuning run: options, stages, sampling, the trial, the search space, warm start, refinement, confirmation."""
