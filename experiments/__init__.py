"""One module per paper figure (``fig_*.py``); ``python -m experiments`` runs them all."""
