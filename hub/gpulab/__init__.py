"""gpulab: a multi-user GPU JupyterHub for a lab's own servers.

Where things live:
    settings.py, yamlfile.py   the admin's config file: declared settings, file:line errors
    naming.py                  collision-free container and volume names
    containers.py              settings + user + GPUs -> Docker create options (pure)
    spawner.py                 GpulabSpawner (DockerSpawner subclass): the I/O shell
    auth.py                    token login
    hubconfig.py               wires all of it into JupyterHub's config
    cli.py                     the `gpulab` command
"""

__version__ = "0.1.0"
