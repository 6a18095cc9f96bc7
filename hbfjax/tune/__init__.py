"""Gradient-based tuning of policy knobs with optax (issue 13, DESIGN.md §6): problems, estimators, the loop, the grid check."""
