"""Lock backends, one per file, named in ``RLOCKS[alias]["BACKEND"]`` as Django names cache backends."""
