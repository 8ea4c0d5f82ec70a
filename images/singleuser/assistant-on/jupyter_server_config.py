# gpulab: JupyterLab's assistant (jupyter-ai) asks the lab's own model, through the hub.
#
# Read only where the hub turned the lab assistant on: it points JUPYTER_CONFIG_PATH here
# (gpulab.spawn.containers) while gpulab.yaml names a model. Elsewhere the image's
# defaults (assistant-off/, in /opt/venv/etc/jupyter) leave jupyter-ai unloaded, server
# and JupyterLab parts both: it adds ~1.4 s and ~90 MB to a server's start.
#
# One provider, OpenAI's API at the hub (/hub/api/gpulab/assistant/v1, which checks who
# may ask, limits and counts), with the server's own token as the key: the member asks
# as herself and the image holds no key. The model's name is the hub's business (it
# sends every request to the lab's one model). Nothing else is configured: no outside
# endpoint, no inline completion (it would ask at every pause in typing).
import os

# jupyter-ai's JupyterLab part lives beside this file, out of JupyterLab's default path
# (the image's Dockerfile): elsewhere no browser fetches its scripts. Appended, so that
# collaboration-on/ keeps its own.
c.LabApp.extra_labextensions_path.append(  # noqa: F821
    os.path.join(os.path.dirname(__file__), "labextensions"))

if os.environ.get("JUPYTERHUB_API_URL") and os.environ.get("JUPYTERHUB_API_TOKEN"):
    MODEL = "openai-chat-custom:lab-assistant"
    c.AiExtension.allowed_providers = ["openai-chat-custom"]  # noqa: F821
    c.AiExtension.default_language_model = MODEL  # noqa: F821
    c.AiExtension.default_api_keys = {"OPENAI_API_KEY": os.environ["JUPYTERHUB_API_TOKEN"]}  # noqa: F821
    c.AiExtension.model_parameters = {  # noqa: F821
        MODEL: {"openai_api_base": os.environ["JUPYTERHUB_API_URL"] + "/gpulab/assistant/v1"}}
    # jupyter-ai keeps the chosen model and keys in a file whose values then win over
    # the ones above (a lab's later change would never reach her): in the container's
    # runtime folder, not her home, so every start takes the lab's.
    runtime = os.path.join(os.environ.get("JUPYTER_RUNTIME_DIR", "/tmp/jupyter-runtime"),
                           "jupyter_ai")
    os.makedirs(runtime, exist_ok=True)  # jupyter-ai makes only its default folder
    c.ConfigManager.config_path = os.path.join(runtime, "config.json")  # noqa: F821
    c.AiExtension.error_logs_dir = os.path.join(runtime, "logs")  # noqa: F821
