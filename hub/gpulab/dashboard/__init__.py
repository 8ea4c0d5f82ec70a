"""The operators' GPU dashboard: an nvidia-smi-style page as the JupyterHub service
``gpus`` (``/services/gpus/``), run by the hub with ``python -m gpulab.dashboard``.

    sources.py   exporter /api/gpus, or Prometheus when the exporter is unreachable
    view.py      snapshot dict -> view model (pure)
    app.py       tornado app: hub OAuth, the page, its JSON endpoint
    __main__.py  command line and environment
    templates/   dashboard.html (page + inline refresh script), error.html
"""
