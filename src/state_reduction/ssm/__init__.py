"""The home setting of AIRE-Prune and LAST: an S5-style diagonal SSM on a seeded ListOps task, its state-pruning
scores (AIRE energy, LAST H-infinity), the layer normalisation and the global budget."""
