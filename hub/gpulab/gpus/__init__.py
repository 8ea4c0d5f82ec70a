"""GPU allocation: which GPUs there are, who may have which, and who holds which now.

    config.py       config/gpus.yaml parsed and checked (file:line errors); data only
    allocator.py    pure: inventory, allocation, release, reconcile, user options
    leases.py       the hub's lease table over Docker (containers' or services' labels)
    discovery.py    the host's GPUs from NVML (inventory: auto)
    swarm_nodes.py  pure: a Swarm's GPUs and leases from its nodes' and services' labels
    host.py         pure: is this host ready for GPU servers (`gpulab gpu-preflight`)
"""
