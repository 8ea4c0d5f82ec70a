"""The admin-editable settings file (``config/gpulab.yaml``): declared once, checked with
file:line errors.

Every setting is declared in ``SETTINGS`` below with its type, default and help text;
``gpulab config check`` and the hub both load the file through :func:`load_settings`,
which raises :class:`~gpulab.yamlfile.ConfigError` naming the file, line and key of
anything wrong. No other module parses this file.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulab.contract import GPU_UUID, INFRA_VOLUMES, PROJECT_VOLUME_PREFIX
from gpulab.email_address import is_address
from gpulab.environments import EnvironmentError_, parse_environments
from gpulab.sizes import bytes_text, parse_bytes
from gpulab.yamlfile import ConfigError, LocatedYaml, read_yaml

__all__ = ["CLOSED_RANGES", "SETTINGS", "Destination", "Setting", "Settings", "bytes_text",
           "duration_text", "load_settings", "parse_bytes", "parse_destination",
           "parse_duration"]


# ---------------------------------------------------------------- value parsers
# Each takes the raw YAML value and returns the clean value or raises ValueError
# with a message saying what is allowed.

_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value: Any) -> int:
    """'90s', '15m', '2h', '1d', 3600 -> seconds. 0 is allowed (means 'off' where noted)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 90s, 15m, 2h or 1d, got {value!r}")
    if isinstance(value, int) and value >= 0:
        return value
    m = re.fullmatch(r"\s*(\d+)\s*([smhd])\s*", str(value), re.IGNORECASE)
    if not m:
        raise ValueError(f"expected a duration such as 90s, 15m, 2h or 1d, got {value!r}")
    return int(m.group(1)) * _DURATION_UNITS[m.group(2).lower()]


def duration_text(seconds: float) -> str:
    """A duration in words, for messages: 3600 -> '1 h', 5400 -> '1 h 30 min',
    90 -> '1 min 30 s', 172800 -> '2 days'."""
    seconds = int(round(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{days} day{'s' if days != 1 else ''}" if days else "",
             f"{hours} h" if hours else "", f"{minutes} min" if minutes else "",
             f"{secs} s" if secs and not days and not hours else ""]
    return " ".join(p for p in parts if p) or "0 s"


def _string(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return value.strip()


def _positive_number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"expected a positive number, got {value!r}")
    return float(value)


def parse_bool(value: Any) -> bool:
    """true or false, as YAML writes them (also gpus.yaml's)."""
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected a whole number, 0 or more, got {value!r}")
    return value


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"expected a positive whole number, got {value!r}")
    return value


def _username_list(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ValueError(f"expected a list of usernames, got {value!r}")
    return tuple(v.strip().lower() for v in value)


def _abs_path(value: Any) -> str:
    s = _string(value)
    if not s.startswith("/"):
        raise ValueError(f"expected an absolute path inside the container, got {value!r}")
    return s


def _volume_template(value: Any) -> str:
    s = _string(value)
    if "{username}" not in s:
        raise ValueError(
            f"the home volume name must contain {{username}} so that each user gets "
            f"their own volume, got {value!r}"
        )
    if "{servername}" in s and "{username}--{servername}" not in s:
        raise ValueError(
            f"{{servername}} must follow {{username}}-- (as in gpulab-home-{{username}}--"
            f"{{servername}}), or one member's server and another member's could share a "
            f"home (alice's server b-c and alice-b's server c), got {value!r}")
    # Could some username turn it into the name of one of the stack's own volumes?
    pattern = re.escape(s).replace(r"\{username\}", "[a-z0-9].*").replace(
        r"\{servername\}", ".*")
    taken = [v for v in INFRA_VOLUMES if re.fullmatch(pattern, v)]
    if taken:
        raise ValueError(
            f"with {value!r} a user could get the volume {taken[0]} (gpulab's own) as "
            f"their home; give home volumes a prefix of their own, e.g. gpulab-home-{{username}}"
        )
    # ... or of a group's project folder (gpulab-project-NAME), another group's files?
    before = s.split("{username}", 1)[0]
    rest = PROJECT_VOLUME_PREFIX[len(before):]
    if before.startswith(PROJECT_VOLUME_PREFIX) or (
            PROJECT_VOLUME_PREFIX.startswith(before) and re.match(r"[a-z0-9]", rest)):
        raise ValueError(
            f"with {value!r} a user could get a group's project folder "
            f"({PROJECT_VOLUME_PREFIX}NAME) as their home; give home volumes a prefix of "
            f"their own, e.g. gpulab-home-{{username}}")
    return s


def _network_list(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ValueError(f"expected a list of IP addresses or networks, got {value!r}")
    out = []
    for item in value:
        try:
            out.append(str(ipaddress.ip_network(str(item).strip(), strict=False)))
        except ValueError:
            raise ValueError(f"{item!r} is not an IP address or network (e.g. 10.0.0.5 "
                             f"or 10.0.0.0/24)") from None
    return tuple(out)


# The destinations gpulab-netguard closes to members' servers (gpulab.netguard): private,
# shared (carrier-grade NAT) and link-local ranges, where a lab's own machines are.
CLOSED_RANGES = tuple(ipaddress.ip_network(n) for n in (
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16",
    "fc00::/7", "fe80::/10"))
_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
_HOST_NAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*")


@dataclass(frozen=True)
class Destination:
    """One entry of ``network.allow``: a network (``10.0.5.20/32``) or a host name
    (``nas.lab.example``, looked up by gpulab-netguard), and a port (None: every port)."""

    host: str
    port: int | None = None

    @property
    def network(self) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
        try:
            return ipaddress.ip_network(self.host)
        except ValueError:
            return None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}" if self.port else host


def parse_destination(item: Any) -> Destination:
    """``10.0.5.20/32:2049``, ``10.0.5.0/24``, ``ldap.lab.example:636``, ``[fd00::5]:2049``
    or ``fd00::/8`` -> a :class:`Destination`; ValueError saying what is allowed."""
    example = ("expected ADDRESS[/BITS][:PORT] or HOST:PORT, e.g. 10.0.5.20/32:2049, "
               "10.0.5.0/24 or ldap.lab.example:636")
    if not isinstance(item, str) or not item.strip():
        raise ValueError(f"{example}, got {item!r}")
    text = item.strip()
    m = re.fullmatch(r"\[([0-9a-fA-F:.]+(?:/\d+)?)\](?::(\w+))?", text)  # [IPv6]:PORT
    if m:
        host, port = m.group(1), m.group(2)
    elif text.count(":") > 1:  # IPv6 without a port
        host, port = text, None
    else:
        host, _, port = text.partition(":")
        port = port if _ else None
    if port is not None:
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{item!r}: the port must be a number from 1 to 65535 "
                             f"({example})")
        port = int(port)
    try:
        network = ipaddress.ip_network(host)
    except ValueError as e:
        if "host bits set" in str(e):
            address, bits = host.split("/")
            wide = ipaddress.ip_network(host, strict=False)
            raise ValueError(f"{item!r} has bits set past /{bits}: write {address} for the "
                             f"one machine, or {wide} for the network") from None
        name = host.rstrip(".").lower()
        if not _HOST_NAME.fullmatch(name) or name.replace(".", "").isdigit():
            raise ValueError(f"{item!r} is not an address, network or host name "
                             f"({example})") from None
        return Destination(name, port)
    if not any(network.version == r.version and network.subnet_of(r)
               for r in CLOSED_RANGES):
        closed = ", ".join(map(str, CLOSED_RANGES))
        raise ValueError(f"{item!r} is not inside the ranges gpulab closes to members "
                         f"({closed}): members' servers reach it already, or it spans "
                         f"more than one of them; open a network inside one")
    return Destination(str(network), port)


def _destinations(value: Any) -> tuple[Destination, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ValueError(f"expected a list such as [10.0.5.20/32:2049, "
                         f"ldap.lab.example:636], got {value!r}")
    out: list[Destination] = []
    for item in value:
        d = parse_destination(item)
        if d in out:
            raise ValueError(f"{item!r} is listed twice")
        out.append(d)
    return tuple(out)


def _homes(value: Any) -> str:
    if value not in ("machine", "shared"):
        raise ValueError(f"expected machine or shared, got {value!r}")
    return value


def _home_size(value: Any) -> int:
    if value in (None, "", 0, "0"):
        return 0
    return parse_bytes(value)


def _optional_string(value: Any) -> str:
    if value in (None, ""):
        return ""
    return _string(value)


def _model_name(value: Any) -> str:
    """A model: its GGUF file's name in the models folder, or (with assistant.endpoint)
    its name at that server; which of them is checked with the other settings."""
    if value in (None, ""):
        return ""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected the name of a .gguf file in the models folder (or, "
                         f"with assistant.endpoint, the model's name there), got {value!r}")
    return value.strip()


def _model_file(value: Any) -> str:
    """A GGUF file's name (or path) inside the models folder: never outside it."""
    if value in (None, ""):
        return ""
    if not isinstance(value, str):
        raise ValueError(f"expected the name of a .gguf file in the models folder, got {value!r}")
    name = value.strip()
    parts = name.split("/")
    if name.startswith("/") or ".." in parts or "" in parts or not name.endswith(".gguf"):
        raise ValueError(f"expected the name of a .gguf file in the models folder "
                         f"(GPULAB_MODELS_DIR), such as model.gguf or coder/model.gguf, "
                         f"got {value!r}")
    return name


def _gpu_refs(value: Any) -> tuple[int | str, ...]:
    """GPUs of this machine, by NVML index or UUID, as ``nvidia-smi -L`` prints them."""
    if value is None:
        return ()
    if isinstance(value, int | str) and not isinstance(value, bool):
        value = [value]
    refs: list[int | str] = []
    for ref in value if isinstance(value, list) else [value]:
        if isinstance(ref, str) and GPU_UUID.fullmatch(ref.strip()):
            ref = ref.strip()
        elif isinstance(ref, bool) or not isinstance(ref, int) or not 0 <= ref < 1000:
            raise ValueError(f"expected GPUs of this machine as nvidia-smi -L names them: "
                             f"indexes (0, 1, ...) or UUIDs (GPU-..., MIG-...), got {ref!r}")
        if ref in refs:
            raise ValueError(f"GPU {ref!r} is listed twice")
        refs.append(ref)
    return tuple(refs)


ASSISTANT_GPUS_REFUSED = (
    "the lab assistant cannot use GPUs yet: the llama.cpp build gpulab installs (xllamacpp "
    "from PyPI) has no GPU backend, so these GPUs would be taken from members while it "
    "computes on the CPU. To answer on a GPU, serve the model with vLLM (or another "
    "OpenAI-compatible server) on it and set assistant.endpoint (docs/assistant.md, The "
    "lab assistant); remove assistant.gpus")


def _assistant_gpus(value: Any) -> tuple[int | str, ...]:
    refs = _gpu_refs(value)
    if refs:
        raise ValueError(ASSISTANT_GPUS_REFUSED)
    return refs


def _openai_base_url(value: Any) -> str:
    s = _url(value)
    if s and not s.rstrip("/").endswith("/v1"):
        raise ValueError(f"expected an OpenAI-compatible server's base URL, ending in /v1 "
                         f"(as OpenAI's clients take it), such as "
                         f"http://vllm.lab.example:8000/v1, got {value!r}")
    return s.rstrip("/")


def _port(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise ValueError(f"expected a port number from 1 to 65535, got {value!r}")
    return value


def _mail_security(value: Any) -> str:
    if value not in ("starttls", "tls", "none"):
        raise ValueError(f"expected starttls, tls or none, got {value!r}")
    return value


def _mail_sender(value: Any) -> str:
    s = _optional_string(value)
    if s and not is_address(s):
        raise ValueError(f"expected one plain e-mail address (ASCII, no name) such as "
                         f"gpulab@lab.example, got {value!r}")
    return s


def _optional_abs_path(value: Any) -> str:
    return _abs_path(value) if value not in (None, "") else ""


def _login_provider(value: Any) -> str:
    if value not in ("none", "oidc", "ldap"):
        raise ValueError(f"expected none (login tokens only), oidc (the lab's OpenID "
                         f"Connect provider beside login tokens) or ldap (the lab's LDAP "
                         f"directory beside login tokens), got {value!r}")
    return value


def _ldap_filter(value: Any) -> str:
    s = _optional_string(value)
    if s and not (s.startswith("(") and s.endswith(")") and s.count("(") == s.count(")")):
        raise ValueError(f"expected an LDAP filter in parentheses, e.g. (!(nsAccountLock=TRUE)), "
                         f"got {value!r}")
    return s


def _ldap_url(value: Any) -> str:
    s = _optional_string(value)
    if s and not re.fullmatch(r"ldaps?://[^\s/?#]+/?", s):
        raise ValueError(f"expected ldap://HOST[:PORT] or ldaps://HOST[:PORT], got {value!r}")
    return s


def _url(value: Any) -> str:
    s = _optional_string(value)
    if s and not re.fullmatch(r"https?://[^\s/?#]+(/\S*)?", s):
        raise ValueError(f"expected an http:// or https:// URL, got {value!r}")
    return s


def _name_list(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ValueError(f"expected a list of group names, got {value!r}")
    return tuple(v.strip() for v in value)


def _group_map(value: Any) -> dict[str, tuple[str, ...]]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError("expected a mapping of the identity provider's groups to gpulab's "
                         f"groups, e.g. {{ml-staff: staff}}, got {value!r}")
    return {str(k).strip(): _name_list(v) for k, v in value.items()}


# ---------------------------------------------------------------- declarations


@dataclass(frozen=True)
class Setting:
    key: str  # dotted path in the YAML file, e.g. "spawn.shm_size"
    parse: Callable[[Any], Any]
    default: Any
    help: str


SETTINGS: tuple[Setting, ...] = (
    Setting("hub.admins", _username_list, (),
            "Usernames with hub admin rights. The first one gets a login token from "
            "`make up`. Example: [alice]"),
    Setting("hub.operators", _username_list, (),
            "Usernames in the `operators` group: they may open the GPU dashboard "
            "(/services/gpus/) and read the hub's metrics. Example: [carol]"),
    Setting("hub.trusted_proxies", _network_list, (),
            "Reverse proxies in front of gpulab (addresses or networks) whose "
            "X-Forwarded-For header names the real client, e.g. a TLS edge on another "
            "host. The login throttle counts failures per client address; from anyone "
            "else that header is ignored. gpulab's own proxy is always trusted. "
            "Example: [10.0.0.5]"),
    Setting("hub.member_token_max_age", parse_duration, 30 * 86400,
            "Longest lifetime of an API token that members make for themselves (for "
            "scripts): one asked for without an expiry gets this one, a longer one is "
            "refused. Login "
            "tokens are issued by admins (gpulab token issue) and are not affected. "
            "0 removes the limit. Example: 7d"),
    Setting("hub.idle_timeout", parse_duration, 3600,
            "Stop servers that have been idle this long, releasing their GPUs "
            "(jupyterhub-idle-culler); 0 turns culling off. Example: 2h"),
    Setting("hub.sharing", parse_bool, True,
            "Members may share a running server with a colleague or a group, who then "
            "opens it signed in as themselves (the /hub/sharing page; docs/members.md). "
            "Shares end when the server stops. Members can then look up a colleague's "
            "or a group's name. Read at hub start. Example: false"),
    Setting("hub.swarm", parse_bool, False,
            "Run members' servers across several GPU servers joined in a Docker Swarm "
            "(docs/swarm.md): each server is a Swarm service placed on the "
            "machine whose GPUs it leased, created through the Docker proxy in front of "
            "the Swarm manager. false: one host, one container per server. Read at hub "
            "start. Example: true"),
    Setting("spawn.image", _string, "gpulab/singleuser:latest",
            "Docker image of the single-user server. `make images` builds it. With "
            "spawn.environments, each environment names its own image instead."),
    Setting("spawn.environments", parse_environments, (),
            "The environments members choose from on the spawn form (and with "
            "{\"environment\": NAME} through the REST API), the first open to a member "
            "being hers by default: a list of {name, image, description, gpus (whether "
            "its servers may have GPUs; default true), groups (the JupyterHub groups "
            "that may use it; default [], every member; admins may use all), and "
            "optionally cpus, memory, cpus_per_gpu, memory_per_gpu, max_cpus and "
            "max_memory (as in gpus.yaml: they replace gpus.yaml's for its servers, "
            "never past a member's own max_cpus and max_memory)}. Only the "
            "listed images may run as members' servers; an image changed here is used "
            "from a member's next start (with hub.swarm, every machine needs each image: "
            "docs/swarm.md). Empty (the default): "
            "one environment, spawn.image. Example: [{name: pytorch, image: "
            "gpulab/singleuser:latest, description: PyTorch and CUDA}, {name: writing, "
            "image: lab/light:2026, gpus: false}]"),
    Setting("spawn.network", _string, "gpulab",
            "User-defined Docker network shared by the hub and the user containers."),
    Setting("spawn.home_volume", _volume_template, "gpulab-home-{username}",
            "Name of each user's persistent home volume; {username} is the user's "
            "escaped name, {servername} the named server's (empty for the default)."),
    Setting("spawn.home_size", _home_size, 0,
            "Most a member's home volume may hold; 0 for no limit (homes then share the "
            "disk with each other and with the hub's data). Applied by Docker when the "
            "home is created, so only to homes made after it is set: it needs Docker's "
            "volumes folder on XFS mounted with project quotas (pquota); where they are "
            "not, make up refuses to start and spawns of new homes fail, saying so "
            "(docs/backups-and-upgrades.md, Home sizes). Not with hub.swarm. Example: 50g"),
    Setting("spawn.project_size", _home_size, 0,
            "Most each group project folder (gpus.yaml groups: NAME: {projects: [...]}) "
            "may hold; 0 for no limit. Applied as spawn.home_size is, when the folder is "
            "created (at the first start of a member who has it), with the same needs. "
            "Not with hub.swarm. Example: 200g"),
    Setting("spawn.home_path", _abs_path, "/home/jovyan",
            "Where the home volume is mounted in the container."),
    Setting("spawn.datasets_volume", _optional_string, "gpulab-datasets",
            "Shared datasets volume mounted read-only in every container; empty for none."),
    Setting("spawn.datasets_path", _abs_path, "/datasets",
            "Where the datasets volume is mounted."),
    Setting("spawn.shm_size", parse_bytes, parse_bytes("2g"),
            "Size of /dev/shm. PyTorch DataLoader workers pass batches through it; "
            "Docker's default of 64m makes them crash. Example: 2g"),
    Setting("spawn.mem_limit", parse_bytes, parse_bytes("8g"),
            "Memory limit of each user container. Example: 16g"),
    Setting("spawn.cpu_limit", _positive_number, 4.0,
            "CPU limit of each user container, in cores. Example: 2.5"),
    Setting("spawn.pids_limit", _positive_int, 1024,
            "Maximum number of processes in each user container."),
    Setting("spawn.shared_gpu_memory_cap", parse_bool, True,
            "On a GPU several servers share (gpus.yaml mode: shared), cap each PyTorch "
            "process of a server at 1/max_users of the GPU's memory "
            "(PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction), so that one member's "
            "notebook cannot take the memory the others need. Only in images labelled "
            "org.gpulab.pytorch-memory-cap (gpulab's single-user image is): an older "
            "torch refuses the option. PyTorch's own cap: a member can lift it in her "
            "code and other frameworks ignore it (docs/operations.md). false: no cap."),
    Setting("spawn.swarm_homes", _homes, "machine",
            "With hub.swarm: where members' homes live. machine: on the GPU server where "
            "the member's server first ran (a Docker volume there); her server always "
            "goes back to that machine, and cannot start while it is down or full. "
            "shared: spawn.home_volume is storage every machine mounts (docs/swarm.md, "
            "GPU servers, shared homes); servers go wherever GPUs are free."),
    Setting("spawn.collaboration", parse_bool, False,
            "JupyterLab's real-time collaboration (jupyter-collaboration) in members' "
            "servers: two members in one shared server edit a notebook together and see "
            "each other's cursors, and every notebook saves itself as it is edited. Off, "
            "JupyterLab saves as usual, and a save that fails for a full home says so in a "
            "dialog (with it on, the failure is only in the server's log). Read at each "
            "spawn. Example: true"),
    Setting("spawn.start_timeout", parse_duration, 180,
            "How long a server may take to start before the spawn fails. Example: 3m"),
    Setting("network.allow", _destinations, (),
            "What members' servers (and jobs) may reach on the lab's private networks. "
            "gpulab-netguard drops their traffic to private, shared and link-local "
            "ranges (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10, "
            "169.254.0.0/16, fc00::/7, fe80::/10): the lab's NAS, consoles, printers and "
            "directory are not members' business unless listed here, as ADDRESS[/BITS]"
            "[:PORT] (no port: every port) or HOST:PORT (looked up again every few "
            "seconds). DNS (port 53) to those ranges stays open, for the lab's resolvers. "
            "Read again within seconds of an edit; on a Swarm, by each machine's "
            "netguard from its own copy of this file. Example: [10.0.5.20/32:2049, "
            "ldap.lab.example:636]"),
    Setting("backup.every", parse_duration, 86400,
            "How often gpulab-backup backs up the lab (homes, the hub's databases, "
            "config/, secrets/, Prometheus' data) into its restic repository "
            "(GPULAB_BACKUP_DIR, docs/backups-and-upgrades.md): this long after the last good "
            "backup, or after the service started when there is none yet. 0: only when "
            "an admin runs `make backup`. Example: 12h"),
    Setting("backup.keep_last", _count, 3,
            "How many of the newest backups to keep whatever their day: a backup made "
            "by hand before an upgrade outlives the scheduled one that follows it the "
            "same day. Example: 5"),
    Setting("backup.keep_daily", _count, 7,
            "How many daily backups to keep (the newest of each day); older ones are "
            "forgotten and their data pruned after each backup. Example: 14"),
    Setting("backup.keep_weekly", _count, 4,
            "How many weekly backups to keep besides the daily ones. Example: 8"),
    Setting("backup.keep_monthly", _count, 12,
            "How many monthly backups to keep besides the weekly ones. Example: 24"),
    Setting("backup.alert_after", parse_duration, 2 * 86400,
            "Alert the operators (GpulabBackupTooOld) when the last good backup is older "
            "than this; 0 turns the alert off. Example: 36h"),
    Setting("backup.datasets", parse_bool, False,
            "Back up the shared datasets volume (spawn.datasets_volume) too. Off by "
            "default: datasets are large and usually fetched again from where they came "
            "from. Example: true"),
    Setting("mail.smtp_host", _optional_string, "",
            "The lab's SMTP server, for e-mail to members: a member who gives her address "
            "when she joins the line for GPUs is told by e-mail when her turn comes. Empty: "
            "gpulab sends no e-mail (members are told on the hub's pages). Example: "
            "smtp.lab.example"),
    Setting("mail.smtp_port", _port, 587,
            "The SMTP server's port: 587 (submission, with starttls), 465 (tls) or 25. "
            "Example: 465"),
    Setting("mail.security", _mail_security, "starttls",
            "How the connection to the SMTP server is protected: starttls (upgraded to TLS "
            "after connecting; refused if the server cannot), tls (TLS from the start), or "
            "none (a relay on the lab's own network only). Example: tls"),
    Setting("mail.from", _mail_sender, "",
            "The sender of gpulab's e-mail; needed with mail.smtp_host. Example: "
            "gpulab@lab.example"),
    Setting("mail.ca_file", _optional_abs_path, "",
            "A CA bundle (path inside the hub container) for an SMTP server whose "
            "certificate a private CA signed; empty: the system's CAs. The server's name "
            "(mail.smtp_host) must be in its certificate either way. Example: "
            "/srv/gpulab/config/lab-ca.pem"),
    Setting("mail.username", _optional_string, "",
            "Log in to the SMTP server as this user, with the password in the file "
            "secrets/smtp-password (never in this file); empty: no login. Example: gpulab"),
    Setting("assistant.model", _model_name, "",
            "The lab assistant's model (gpulab.assistant): a GGUF file in the models "
            "folder (GPULAB_MODELS_DIR on the host, /var/lib/gpulab/models by default), "
            "served by llama.cpp's server on the hub's machine, on its CPU; or, with "
            "assistant.endpoint, the model's name at that server (as its /v1/models lists "
            "it). Members ask it through the hub, as themselves. gpulab downloads nothing: "
            "put the file there. Empty: no assistant. Read again within seconds of an "
            "edit. Example: qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
    Setting("assistant.endpoint", _openai_base_url, "",
            "An OpenAI-compatible server the lab runs already (vLLM, Ollama, llama.cpp's "
            "server, on a GPU machine of its own): its base URL, ending in /v1. Members' "
            "requests go there through the hub, with the same door as gpulab's own "
            "assistant (their own tokens, assistant.groups, the per-member limits and "
            "counting; nothing of a request reaches a log), with the key in "
            "secrets/assistant-endpoint-key when that file exists (never in this file). "
            "The stack's own llama.cpp then serves nothing. Empty: the stack's own. "
            "Example: http://vllm.lab.example:8000/v1"),
    Setting("assistant.groups", _name_list, (),
            "The JupyterHub groups whose members may ask the assistant; [] every member. "
            "Admins always may. Example: [students, staff]"),
    Setting("assistant.requests_per_minute", _positive_int, 20,
            "How many requests one member may send the assistant in a minute; more are "
            "answered 429 with when to try again. Example: 60"),
    Setting("assistant.max_tokens", _positive_int, 512,
            "The longest answer, in tokens: a request asking for more (or for no limit) "
            "gets this many at most. Example: 1024"),
    Setting("assistant.gpus", _assistant_gpus, (),
            "Refused for now, whatever it names: the llama.cpp build gpulab installs "
            "(xllamacpp from PyPI) has no GPU backend, so GPUs held for the assistant would "
            "be taken from members while it computes on the CPU. To answer on a GPU, serve "
            "the model with vLLM (or another OpenAI-compatible server) and set "
            "assistant.endpoint (docs/assistant.md). Only []."),
    Setting("assistant.threads", _positive_int, 2,
            "CPU threads llama.cpp computes with. Example: 8"),
    Setting("assistant.parallel", _positive_int, 4,
            "Requests the server computes at once (each with assistant.context tokens of "
            "context); more wait their turn. Example: 8"),
    Setting("assistant.context", _positive_int, 4096,
            "Tokens of context per request (the question, the code sent with it, and the "
            "answer). Example: 8192"),
    Setting("login.provider", _login_provider, "none",
            "How members sign in besides admin-issued login tokens: none (login tokens "
            "only) or oidc (the lab's OpenID Connect provider, e.g. Keycloak, Authentik, "
            "Dex; docs/https-and-sign-in.md, Single sign-on). Login tokens keep working either "
            "way. ldap: the lab's LDAP directory; the sign-in form then takes members' directory "
            "passwords too. Read at hub start. Example: oidc"),
    Setting("login.label", _string, "Lab sign-in",
            "The name of the identity provider on the sign-in page's button (\"Sign in "
            "with ...\"). Example: Lab account"),
    Setting("login.oidc_authorize_url", _url, "",
            "The provider's authorization endpoint (authorization_endpoint in its "
            "/.well-known/openid-configuration). Example: "
            "https://id.lab.example/realms/lab/protocol/openid-connect/auth"),
    Setting("login.oidc_token_url", _url, "",
            "The provider's token endpoint (token_endpoint). Example: "
            "https://id.lab.example/realms/lab/protocol/openid-connect/token"),
    Setting("login.oidc_userinfo_url", _url, "",
            "The provider's userinfo endpoint (userinfo_endpoint); the hub asks it every "
            "login.refresh_every whether a member is still in the directory. Example: "
            "https://id.lab.example/realms/lab/protocol/openid-connect/userinfo"),
    Setting("login.oidc_client_id", _optional_string, "",
            "The client ID registered for gpulab at the provider; its secret goes in "
            "secrets/oidc-client-secret (never in this file). Register the redirect URI "
            "<public URL>/hub/oidc/oauth_callback. Example: gpulab"),
    Setting("login.oidc_scopes", _name_list, ("openid", "profile", "email"),
            "Scopes gpulab asks for. Add the one that releases the groups claim if the "
            "provider needs one (often groups). Example: [openid, profile, email, groups]"),
    Setting("login.oidc_username_claim", _string, "preferred_username",
            "The userinfo claim that is the member's gpulab username; it must be a valid "
            "gpulab username (lowercase letters, digits, - and _). Example: preferred_username"),
    Setting("login.oidc_groups_claim", _string, "groups",
            "The userinfo claim that lists the member's groups. Example: groups"),
    Setting("login.oidc_ca_file", _optional_abs_path, "",
            "A CA bundle (path inside the hub container) for a provider whose certificate "
            "a private CA signed; empty: the system's CAs. Example: /srv/gpulab/config/lab-ca.pem"),
    Setting("login.allowed_groups", _name_list, (),
            "The provider's groups whose members may sign in (required with a provider); "
            "a member who leaves all of them loses access within login.refresh_every. "
            "Example: [gpu-users]"),
    Setting("login.admin_groups", _name_list, (),
            "The provider's groups whose members are hub admins (besides hub.admins). "
            "Example: [gpu-admins]"),
    Setting("login.operator_groups", _name_list, (),
            "The provider's groups whose members are operators (besides hub.operators). "
            "Example: [gpu-ops]"),
    Setting("login.groups", _group_map, {},
            "The provider's groups mapped to gpulab's groups (gpus.yaml groups: quotas, "
            "pools, budgets): a member is in exactly the gpulab groups her provider groups "
            "map to, kept in step at every check. Example: {ml-staff: staff, students: students}"),
    Setting("login.ldap_url", _ldap_url, "",
            "The lab's LDAP directory (login.provider: ldap): ldaps://HOST (TLS from the "
            "start) or ldap://HOST (upgraded with StartTLS). Example: ldaps://ldap.lab.example"),
    Setting("login.ldap_starttls", parse_bool, True,
            "With an ldap:// URL, upgrade to TLS before sending anything (StartTLS). Members' "
            "passwords travel to the directory: gpulab refuses false. Example: true"),
    Setting("login.ldap_ca_file", _optional_abs_path, "",
            "A CA bundle (path inside the hub container) for a directory whose certificate a "
            "private CA signed; empty: the system's CAs. Example: /srv/gpulab/config/lab-ca.pem"),
    Setting("login.ldap_user_base", _optional_string, "",
            "Where members are, searched below. Example: ou=people,dc=lab,dc=example"),
    Setting("login.ldap_user_attribute", _string, "uid",
            "The attribute that is a member's username (uid; sAMAccountName on Active "
            "Directory). Example: uid"),
    Setting("login.ldap_user_filter", _ldap_filter, "",
            "An LDAP filter a member's entry must also match, checked at sign-in and every "
            "login.refresh_every: how a disabled account loses access. Active Directory: "
            "(!(userAccountControl:1.2.840.113556.1.4.803:=2)); FreeIPA: "
            "(!(nsAccountLock=TRUE)); OpenLDAP with ppolicy: (!(pwdAccountLockedTime=*)). "
            "Empty: none. Example: (!(nsAccountLock=TRUE))"),
    Setting("login.ldap_group_base", _optional_string, "",
            "Only groups below this DN count (for allowed_groups, admin_groups and groups); "
            "set it where others may create groups elsewhere in the directory, or a group "
            "named gpu-admins anywhere would make admins. Empty: any. Example: "
            "ou=groups,dc=lab,dc=example"),
    Setting("login.ldap_bind_dn", _optional_string, "",
            "The hub's own directory account, which looks members up at sign-in and every "
            "login.refresh_every (read access to members and their groups); its password in "
            "secrets/ldap-bind-password. Example: cn=gpulab,ou=services,dc=lab,dc=example"),
    Setting("login.ldap_groups_attribute", _string, "memberOf",
            "The member's attribute that lists her groups' DNs; each group's name is its cn. "
            "Example: memberOf"),
    Setting("login.ldap_subject_attribute", _string, "entryUUID",
            "The attribute that identifies a member for good, whatever her name (entryUUID; "
            "objectGUID on Active Directory). Example: entryUUID"),
    Setting("login.link_existing_accounts", parse_bool, False,
            "Let the provider's identity of a name take over a hub account of that name "
            "that exists already (made with login tokens, or by an admin) and never signed "
            "in with the provider. Off, such accounts are refused, so that whoever the "
            "provider calls admin does not become the hub's admin; turn it on while moving "
            "a lab whose provider's usernames are the hub's onto single sign-on. Example: true"),
    Setting("login.refresh_every", parse_duration, 300,
            "How often the hub asks the provider again whether a signed-in member is still "
            "in the directory and in which groups; a member removed there loses access "
            "within this time. Example: 1m"),
    Setting("login.unreachable_grace", parse_duration, 86400,
            "How long a member who signed in with the provider keeps access while it cannot "
            "be asked (down, or unreachable from the hub), counted from when it last "
            "vouched for her; then her access ends as a removed member's does, until she "
            "signs in again (a login token of hers still works). 0: no limit, an outage "
            "ends nobody's access, nor a removed member's while it lasts. Example: 8h"),
)

_BY_KEY = {s.key: s for s in SETTINGS}


class Settings(Mapping[str, Any]):
    """Validated settings: ``settings["spawn.shm_size"]`` -> 2147483648."""

    def __init__(self, values: Mapping[str, Any], source: str = "<defaults>"):
        self._values = dict(values)
        self.source = source

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Settings({self.source!r})"

    def with_values(self, changes: Mapping[str, Any]) -> Settings:
        """These settings with *changes* (keys as ``spawn.image``), from the same source."""
        return Settings({**self._values, **changes}, self.source)


def defaults() -> Settings:
    return Settings({s.key: s.default for s in SETTINGS})


def settings_from_yaml(doc: LocatedYaml) -> Settings:
    """Validate a parsed document against SETTINGS; raise ConfigError on the first problem."""
    values = {s.key: s.default for s in SETTINGS}
    if doc.data is None:
        return Settings(values, doc.filename)
    if not isinstance(doc.data, dict):
        raise doc.error((), "expected a mapping of sections (hub:, spawn:) at the top level")
    for path, raw in doc.leaves():
        key = ".".join(path)
        setting = _BY_KEY.get(key)
        if setting is None:
            raise doc.error(path, doc.unknown_key_message(key, _BY_KEY))
        try:
            values[key] = setting.parse(raw)
        except EnvironmentError_ as e:  # at the entry's own line
            raise doc.error(path + e.where, str(e)) from None
        except ValueError as e:
            raise doc.error(path, str(e)) from None
    for sized in ("home_size", "project_size"):
        if values["hub.swarm"] and values[f"spawn.{sized}"]:
            raise doc.error(("spawn", sized),
                            f"spawn.{sized} is not applied with hub.swarm yet (each machine "
                            f"creates its volumes itself): remove it, or set it to 0")
    if values["assistant.model"] and not values["assistant.endpoint"]:
        try:
            _model_file(values["assistant.model"])
        except ValueError as e:
            raise doc.error(("assistant", "model"), f"{e} (or the model's name at an "
                                                    f"OpenAI-compatible server, with "
                                                    f"assistant.endpoint)") from None
    if values["assistant.endpoint"] and not values["assistant.model"]:
        raise doc.error(("assistant", "endpoint"),
                        "assistant.endpoint needs assistant.model: the model's name at that "
                        "server, as its /v1/models lists it")
    if values["mail.username"] and values["mail.security"] == "none":
        raise doc.error(("mail", "username"),
                        "mail.username with mail.security: none would send the SMTP "
                        "password unencrypted: use starttls or tls")
    if values["mail.smtp_host"] and not values["mail.from"]:
        raise doc.error(("mail", "smtp_host"),
                        "mail.smtp_host is set without mail.from: give the address gpulab's "
                        "e-mail comes from, e.g. from: gpulab@lab.example")
    if values["login.provider"] == "ldap":
        missing = [k for k in ("login.ldap_url", "login.ldap_user_base", "login.ldap_bind_dn",
                               "login.allowed_groups") if not values[k]]
        if missing:
            raise doc.error(("login", "provider"), f"ldap needs {', '.join(missing)} as well")
        if values["login.ldap_url"].startswith("ldap://") and not values["login.ldap_starttls"]:
            raise doc.error(("login", "ldap_starttls"),
                            "false would send members' passwords to the directory "
                            "unencrypted: use StartTLS (true) or an ldaps:// URL")
    if values["login.provider"] == "oidc":
        missing = [k for k in ("login.oidc_authorize_url", "login.oidc_token_url",
                               "login.oidc_userinfo_url", "login.oidc_client_id",
                               "login.allowed_groups") if not values[k]]
        if missing:
            raise doc.error(("login", "provider"),
                            f"oidc needs {', '.join(missing)} as well")
        if "openid" not in values["login.oidc_scopes"]:
            raise doc.error(("login", "oidc_scopes"),
                            "must include openid: without it the provider does not say "
                            "who signed in (sub)")
        if values["login.refresh_every"] <= 0:
            raise doc.error(("login", "refresh_every"),
                            "must be more than 0: it bounds how long a "
                            "member removed from the directory keeps access")
    return Settings(values, doc.filename)


def load_settings(path: str | Path) -> Settings:
    """Read and validate a settings file; a missing one is an error saying where."""
    return settings_from_yaml(read_yaml(path))


def describe() -> str:
    """Every setting with its default and help, for `gpulab config describe`."""
    lines = []
    for s in SETTINGS:
        lines.append(f"{s.key} (default: {s.default!r})\n    {s.help}")
    return "\n".join(lines)


__all__ += ["ConfigError", "defaults", "settings_from_yaml", "describe"]
