"""Physics of HBF: plane collisions, program/read interference, blocks and GC, endurance."""
