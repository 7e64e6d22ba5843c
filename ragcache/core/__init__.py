"""The cache itself: the facade (``cache``), the level walk (``levels``), the tier protocol and its breaker
(``tier``), batching of misses (``batching``), single flight (``flight``), write-behind (``writeback``), keys and
stats. It imports nothing above it: no concrete level, model, retrieval or service code."""
