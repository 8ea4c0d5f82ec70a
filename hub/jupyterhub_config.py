# JupyterHub configuration for gpulab. Everything an admin changes lives in
# config/gpulab.yaml; the wiring lives in gpulab.hubconfig.
from gpulab.hubconfig import configure

configure(c)  # noqa: F821 - `c` is provided by JupyterHub
