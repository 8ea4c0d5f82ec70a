"""The operators' GPU dashboard: an nvidia-smi-style page as the JupyterHub service
``gpus`` (``/services/gpus/``), run by the hub with ``python -m gpulab.dashboard``.

    sources.py   exporter /api/gpus, or Prometheus when the exporter is unreachable
    view.py      snapshot dict -> view model (pure)
    leases.py    the admins' lease table and stuck-lease release (pure rules + I/O)
    history.py   each GPU's utilization, memory and holders over an hour, day or week
    charts.py    server-side SVG for the history (pure; no JavaScript)
    usage.py     GPU-hours per member and group, per day and month: the PI's page
    members.py   the admins' members page: members, login tokens, revocation
    app.py       tornado app: hub OAuth, the pages, their JSON endpoints
    __main__.py  command line and environment
    templates/   dashboard.html (page + inline refresh script), leases.html, error.html
"""
