"""Memory physics of a package: HBM, HBF, the links between them and the GPU, base-die SRAM
(DESIGN.md §2, §4). Takes bytes and counts, never model names: :mod:`hbfjax.serve` composes it with
the workload."""
