"""Step-time model: pure formulas for compute, communication and transfers.

Every function takes sizes as ``int`` bytes and bandwidths as GB/s (10**9 B/s, one direction) and returns
seconds as ``float``; each says where its formula and constants come from. ``comm``: collectives (ring,
hierarchical across nodes, DDP buckets) and PCIe host<->device copies.
"""
