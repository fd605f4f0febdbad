"""Lock backends, one file each, named in RLOCKS[alias]["BACKEND"] like cache backends."""
