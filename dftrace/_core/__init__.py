"""The core: the tree of nodes (:mod:`.tree`), the recording engine
(:mod:`.engine` and :mod:`.iterators`, its C twin ``_speedups``), the record buffer
and its consumers' protocol (:mod:`.buffer`), records and their encoding
(:mod:`.records`, :mod:`.args`), the writer and its sinks (:mod:`.writer`), the
session (:mod:`.session`), process state and its reset (:mod:`.state`), signals
(:mod:`.signals`), configuration (:mod:`.config`) and the resource sampler
(:mod:`.sampler`). Imports flow one way: tree -> engine -> buffer -> state.
"""
