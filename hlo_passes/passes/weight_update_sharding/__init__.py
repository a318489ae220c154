"""weight-update-sharding: the pass (weight_update_sharding.py) and its analysis (analysis.py)."""
