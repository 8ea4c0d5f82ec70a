"""Members' GPU-hours as Prometheus records them: the PromQL the usage page, the line's
fair share and the budgets share (one definition of a GPU-hour).

``gpulab:user_gpus_held`` (monitoring/prometheus/usage.yml) is, once a scrape, how many
GPUs each hub user holds (leases, busy or not); ``gpulab:user_servers_waiting``, how many
of her servers wait in line for GPUs (the usage page's waiting time).
"""

from __future__ import annotations

from gpulab.contract import scrape_seconds

RECORD = "gpulab:user_gpus_held"
JOB_RECORD = "gpulab:user_job_gpus_held"  # of those, the GPUs her jobs hold
WAITING_RECORD = "gpulab:user_servers_waiting"
# The recording rule's interval (usage.yml: one scrape, GPULAB_SCRAPE_SECONDS).
SAMPLE_SECONDS = scrape_seconds()


def gpu_hours_query(seconds: int, sample_seconds: int = SAMPLE_SECONDS,
                    record: str = RECORD) -> str:
    """PromQL: {user: GPU-hours held} over the *seconds* before the query's time (by her
    jobs only, with *record* :data:`JOB_RECORD`)."""
    return f"sum_over_time({record}[{seconds}s]) * {sample_seconds} / 3600"


def average_held_query(step: int) -> str:
    """PromQL: GPUs each member held on average over each *step* seconds."""
    return f"sum by (user) (avg_over_time({RECORD}[{step}s]))"


def waiting_minutes_query(seconds: int, sample_seconds: int = SAMPLE_SECONDS) -> str:
    """PromQL: {user: minutes her servers waited in line} over the *seconds* before the
    query's time (two servers waiting one minute: two minutes)."""
    return f"sum_over_time({WAITING_RECORD}[{seconds}s]) * {sample_seconds} / 60"
