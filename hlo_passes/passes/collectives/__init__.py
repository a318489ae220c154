"""Collective fusion: combiners, reduce-scatter creation, reassociation, simplification and
async conversion of collectives, and the `collective-fusion` pipeline that runs them in order."""
