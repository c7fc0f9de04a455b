"""The optimizer's graph passes, one per module, each a function of (graph, report, ...)."""
