"""The serving engine (DESIGN.md §5): fixed-size state, the Sarathi batcher, request metrics.

``hbfjax.serve`` composes the workload layer (requests, GPU operator times) with the memory system;
this package holds the parts that know neither timing nor memory physics: :mod:`.state` (the slot
table and queue pointers), :mod:`.batching` (the iteration schedule), :mod:`.metrics` (TTFT, TPOT,
E2E, throughput, Little's law) and :mod:`.reference` (the plain-Python oracle).
"""
