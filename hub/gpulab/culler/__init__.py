"""The GPU culler: servers whose GPUs sit idle, or that are too old, are stopped.

A hub service (``python -m gpulab.culler``) with least-privilege scopes, like
jupyterhub-idle-culler, but it judges by the GPUs, not by Jupyter activity: a notebook
left open on a GPU nobody uses is what it is for. Who is culled when comes from
``config/gpus.yaml`` (``gpu_idle_timeout`` and ``max_server_age`` per group or user,
``culling:`` for the threshold and the warning); GPU use comes from Prometheus (the
exporter's series), never from Docker.

* :mod:`.decide`: pure decisions (idle since when, keep / warn / stop), tested by tables.
* :mod:`gpulab.notices` (beside the culler, shared with the spawners and the dashboard):
  the warnings and stop notices it leaves for members, the one file the culler writes and
  the hub's home page reads.
* :mod:`.service`: the thin shell: hub API, Prometheus, the loop.
"""
