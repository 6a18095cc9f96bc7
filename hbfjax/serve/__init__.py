"""The serving layer (DESIGN.md §5): one engine of parts that serves one stream on one system.

* :mod:`.state`, :mod:`.batching`: the fixed-size slot table and the Sarathi iteration schedule;
* :mod:`.engine`: ``simulate(stream_id, seed, knobs, inputs, config)``, the one pass loop, totals and
  output; :mod:`.part` the protocol of a mechanism, :mod:`.parts` the mechanisms (tiers, sessions,
  reads, writes, sram, blocks), :mod:`.totals` the typed Kahan accumulator;
* :mod:`.layer_time`, :mod:`.pass_routing`, :mod:`.cpu_offload`: a pass's timing on an organisation,
  its routing, and the CPU-offloading baselines' timing;
* the kernels the parts wrap: :mod:`.kv_tiers`, :mod:`.kv_cache`, :mod:`.kv_blocks`, :mod:`.hbf_writes`;
* :mod:`.systems`: the named systems and the scenario they serve (the front door), :mod:`.report` and
  :mod:`.metrics` their results on the host;
* :mod:`.reference`, :mod:`.hbflex_reference`: plain-Python oracles of the engine;
* :mod:`.write_scenarios`: the stated writeback timelines of ``hbfjax writeback``.
"""
