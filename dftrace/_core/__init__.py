"""The core: the tree of nodes (:mod:`.tree`), the recording engine
(:mod:`.engine`, its C twin ``_speedups``), records and their encoding
(:mod:`.records`, :mod:`.args`), the writer and its sinks (:mod:`.writer`),
the session (:mod:`.session`), signals (:mod:`.signals`), configuration
(:mod:`.config`) and the resource sampler (:mod:`.sampler`). Imports flow
one way: tree -> engine -> records -> args.
"""
