"""The line: members who asked for GPUs when none were free, served in turn.

* :mod:`gpulab.line.plan` decides, by pure functions, who in line gets which GPUs now
  and which free GPUs are kept for whom;
* :mod:`gpulab.line.store` keeps the line in SQLite next to the hub's database, so that
  it survives a hub restart;
* :mod:`gpulab.line.api` is the hub's REST API for it (join, look, leave) and what the
  spawner asks before it gives GPUs to anyone;
* :mod:`gpulab.line.service` is the hub service that starts the server of the member
  whose turn it is, and stops it again if she does not open it within the claim window.
"""
