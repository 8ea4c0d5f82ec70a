"""GPU allocation: which GPUs there are, who may have which, and who holds which now.

Parsing, policy and allocation are called downward only: allocator -> policy -> config.

    config.py       config/gpus.yaml parsed and checked (file:line errors); data only
    policy.py       pure: what one user may have (defaults, groups, users; pins)
    allocator.py    pure: inventory, allocation, release, reconcile, user options
    budget.py       pure: GPU-hour budgets (budget: in gpus.yaml)
    sharing.py      pure: what one server may take of a GPU it shares with others
    leases.py       the hub's lease table over Docker (containers' or services' labels)
    discovery.py    the host's GPUs from NVML (inventory: auto)
    swarm_nodes.py  pure: a Swarm's GPUs and leases from its nodes' and services' labels
    host.py         pure: is this host ready for GPU servers (`gpulab gpu-preflight`)
"""
