"""Docker access: the hub reaches Docker only through gpulab-docker-proxy.

    proxy.py         the filtering proxy in front of the Docker socket (I/O;
                     the `gpulab-docker-proxy` command)
    policy.py        pure: which calls and which container creates it lets through
    swarm_policy.py  pure: with --swarm, which service, task and node calls
    schema.py        pure: strict JSON and exact-spelling checks both policies share
"""
