"""The line: members who asked for GPUs when none were free, served in turn.

Pure decisions:

* :mod:`gpulab.line.order`: the line's order (first come, or fair share; priorities,
  budgets);
* :mod:`gpulab.line.plan`: who in line gets which GPUs now, and which free GPUs are kept
  for whom;
* :mod:`gpulab.line.eta`: when each member's turn is expected;
* :mod:`gpulab.line.view`: what her hub home page says (and the line in order for the
  operators' GPU dashboard);
* :mod:`gpulab.line.metrics`: the line's metric families (the hub's /hub/metrics).

I/O around them:

* :mod:`gpulab.line.store`: the line in SQLite next to the hub's database, so that it
  survives a hub restart; :mod:`gpulab.line.usage`: members' GPU-hours beside it;
* :mod:`gpulab.line.spawning`: what a spawn asks of the line (the spawner applies it);
* :mod:`gpulab.line.api`: the hub's REST API for it (look, leave);
* :mod:`gpulab.line.service`: the hub service that starts the server of the member whose
  turn it is, stops it if she does not open it within the claim window, and brings
  members' GPU-hours from Prometheus.
"""
