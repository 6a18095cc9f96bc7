"""Workload: what the serving system is asked to do — model and GPU presets, GPU operator timing, MoE
routing, request streams and trace replay (DESIGN.md §2). Knows nothing of HBF: it produces
per-iteration inputs and request arrays that the serving layer composes with the memory physics."""
