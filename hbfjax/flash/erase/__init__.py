"""Erase: blocks, garbage collection, write amplification and lifetime (HBFlex §3.3, §5.4; DASH §V-A2, §VI-H).

``gc`` (block store, allocation, victims, reclaim), ``formulation`` (its array primitives in a CPU and a
GPU form), ``gc_overwrite`` and ``kv_lifetimes`` (the workloads that drive it), ``endurance`` (lifetime
formulas), ``analytic`` (WAF models), ``reference`` (a sequential NumPy FTL).
"""
