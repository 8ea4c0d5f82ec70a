# gpulab: JupyterLab's real-time collaboration (jupyter-collaboration): members who share
# a server edit one notebook together and see each other's cursors.
#
# Read only where the lab turned it on: the hub puts this folder on JUPYTER_CONFIG_PATH
# (gpulab.spawn.containers) while gpulab.yaml's spawn.collaboration is true. Elsewhere the
# image's defaults (collaboration-off/, in /opt/venv/etc/jupyter) leave it unloaded,
# server and JupyterLab parts both: JupyterLab's own saving, with its "home is full"
# dialog (gpulab_home_full.py), which a collaborative save does not show.
import os

# Its JupyterLab parts live beside this file, out of JupyterLab's default path (the
# image's Dockerfile): elsewhere no browser fetches their scripts. Appended, so that the
# assistant's folder (assistant-on/) keeps its own.
c.LabApp.extra_labextensions_path.append(  # noqa: F821
    os.path.join(os.path.dirname(__file__), "labextensions"))
