"""The lab assistant: one language model for the whole lab, on the lab's own machine.

* :mod:`.serve` (``gpulab-assistant``, the stack's ``assistant`` container) runs
  llama.cpp's server on the model gpulab.yaml names (``assistant.model``), loading it
  again when the setting changes; it is on an internal network with the hub alone.
* :mod:`.gateway`: the hub's API handlers that members' requests go through, under
  ``/hub/api/gpulab/assistant``: authenticated as the member (her server's own token),
  refused with the reason, rate-limited per member and counted per member.
* :mod:`.rules`: the decisions (who may ask, how many, what is forwarded), pure.
* :mod:`.gpus`: the GPUs ``assistant.gpus`` would hold, as leases (refused for now: the
  llama.cpp build has no GPU backend; ``make up`` and the spawn form still ask it).
"""
