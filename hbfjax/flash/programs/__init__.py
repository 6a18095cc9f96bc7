"""Programs: program/read interference and the writeback window (HBFlex §3.2, §5.3; DASH §V-B, §VI-F).

``timeline`` (layers × segments of one pass), ``interference`` (plane slots busy with programs),
``writeback`` (the policies and the iteration rollout), ``backlog`` (the Lindley backlog with its exact
stationary law), ``reference`` (the rollout as plain NumPy/Python loops).
"""
