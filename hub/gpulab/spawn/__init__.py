"""Spawning: a member's server as a container (one host) or a Swarm service.

    spawner.py         GpulabSpawner (the `gpulab` spawner): reads what admission needs,
                       records its lease, then lets DockerSpawner create the
                       container; progress, ready check
    swarm_spawner.py   GpulabSwarmSpawner (`gpulab-swarm`): the same, as a Swarm service
    admission.py       pure: whether a start gets GPUs, and which (quota, pools,
                       bookings, the line, budgets), decided once under the lease lock
    form.py            pure: the spawn form (templates/spawn_form.html, autoescaped)
    containers.py      pure: settings + user + GPUs -> Docker create options
    traits.py          pure: which DockerSpawner traits come from gpulab.yaml, and what
                       an admin's own c.DockerSpawner.* does (honoured or refused)
    swarm_services.py  pure: the service spec, and whether a member's service runs
    naming.py          pure: collision-free container and volume names
    reused.py          pure: the options of her last start, when the hub reuses them
    jobs.py            pure: whether a start's options ask for a job, and which
    servers_api.py     JupyterHub's start API, less the named server a refused first
                       start leaves behind
"""
