"""Sweeps at scale (DESIGN.md §6): a grid over a subcommand's options (``grid``), run with knob-only
axes on one compilation and common random numbers (``runner``), written incrementally to a tidy
table that an interrupted sweep resumes (``table``), the highest arrival rate that meets an SLO
(``capacity``), and a seaborn figure of a table (``plot``)."""
