"""gpulab-ssh: ``ssh -p 2222 alice@lab`` opens a shell in alice's own running server.

The design of yuvipanda/jupyterhub-ssh: an SSH server on asyncssh that takes the
member's login token as the password, checks it with the hub's REST API, and attaches
the session to a Jupyter terminal in the member's server. Everything goes through the
hub's proxy with a token of the member's, so the gateway can reach nothing that token
cannot: not another member's server, not Docker. Its one credential of its own (the hub
service gpulab-ssh) serves key sign-ins only (:mod:`gpulab.login.sshkeys`).

* :mod:`gpulab.ssh.limits`: pure: how many connections, sessions and forwards it takes.

* :mod:`gpulab.ssh.policy`: pure decisions: usernames, who a token belongs to, whether
  it may open the server, where the server is, the messages members see.
* :mod:`gpulab.ssh.execwrap`: pure: a command (``ssh -t alice@lab CMD``) typed into a
  terminal with markers around it, and the parser that finds its output and exit status.
* :mod:`gpulab.ssh.terminal`: the Jupyter terminal client (REST + terminado websocket),
  and the pump between it and an SSH session.
* :mod:`gpulab.ssh.channels`: commands with plain pipes and the server's own loopback
  ports (``ssh host CMD``, sftp, scp, ``-L``/``-D``, VS Code's Remote-SSH), through the
  single-user image's gpulab_channels extension.
* :mod:`gpulab.ssh.hostkey`: the host key, made once and kept.
* :mod:`gpulab.ssh.gateway`: what a connection asks of the hub: sign-ins (with the
  throttle, :mod:`gpulab.login.throttle`), her server token, sessions, forwards, and the
  watch that closes her connection when her access ends.
* :mod:`gpulab.ssh.connection`: asyncssh's side: one connection per client, its limits
  and callbacks, handed to the gateway; :func:`~gpulab.ssh.connection.serve` listens.
* :mod:`gpulab.ssh.cli`: the ``gpulab-ssh`` command (``serve``, ``keygen``,
  ``fingerprint``).
"""
