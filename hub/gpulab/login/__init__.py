"""Sign-in: who may enter the hub, with what, and who is an admin.

    auth.py        TokenAuthenticator and the login page (the `gpulab-token`
                   authenticator); configure_login() puts them on the hub's config
    tokens.py      login tokens: the admin-issued tokens that sign in, their REST API
                   and what ends when the last one goes
    throttle.py    failed sign-ins and lockouts, kept across restarts (also gpulab-ssh's)
    forwarded.py   the client's address behind trusted proxies
    redirects.py   where a user may be sent after signing in
    usernames.py   what a valid username is, and how a typed one is normalised
    roles.py       admins and operators from gpulab.yaml, as JupyterHub roles
    tls.py         the certificates HTTPS serves (`gpulab tls`)
    ldap.py        sign-in with the lab's LDAP directory, beside login tokens
    sso.py         sign-in with the lab's OpenID Connect provider, beside login tokens
    identities.py  which provider identity each hub account is, and whose access ended
    sshkeys.py     members' SSH public keys, registered at the hub, for gpulab-ssh
    logscrub.py    no credential in the hub's log, whichever logger writes the line
"""
