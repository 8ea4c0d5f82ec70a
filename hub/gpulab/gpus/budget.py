"""GPU-hour budgets (``budget:`` in ``config/gpus.yaml``): pure functions.

A budget is each member's own GPU-hours per calendar week (from Monday 00:00 UTC) or
month (from the 1st, 00:00 UTC), counted the way the usage page counts them (GPUs held,
busy or not); a group's ``shared`` budget counts its members' GPU-hours together.
Spent, a ``soft`` budget puts her behind everyone within theirs in line
(:mod:`gpulab.line.order`); a ``hard`` one refuses her GPUs (a server with 0 GPUs still
starts) until the next period. Running servers are never stopped for a budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from gpulab.gpus.config import HARD, WEEK, Budget, GpusConfig

__all__ = ["BudgetState", "budget_periods", "budget_state", "next_reset", "period_start"]


def period_start(now: float, per: str) -> float:
    """When the budget period holding *now* began (epoch seconds, UTC)."""
    t = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if per == WEEK:
        t -= timedelta(days=t.weekday())
    else:
        t = t.replace(day=1)
    return t.timestamp()


def next_reset(now: float, per: str) -> float:
    """When the next budget period begins."""
    t = datetime.fromtimestamp(period_start(now, per), UTC)
    if per == WEEK:
        return (t + timedelta(days=7)).timestamp()
    return (t.replace(year=t.year + 1, month=1) if t.month == 12
            else t.replace(month=t.month + 1)).timestamp()


@dataclass(frozen=True)
class BudgetState:
    budget: Budget
    used: float  # GPU-hours this period
    resets_at: float

    @property
    def spent(self) -> bool:
        return self.used >= self.budget.gpu_hours

    @property
    def refuses(self) -> bool:
        return self.spent and self.budget.enforce == HARD

    def _when(self) -> str:
        return datetime.fromtimestamp(self.resets_at, UTC).strftime("%Y-%m-%d %H:%M UTC")

    def _used(self) -> str:
        b = self.budget
        if b.shared_by:
            return (f"Your group {b.shared_by} has used {_hours(self.used)} of its "
                    f"{b.gpu_hours:g} GPU-hours this {b.per}")
        return f"You have used {_hours(self.used)} of your {b.gpu_hours:g} GPU-hours this {b.per}"

    def refusal(self) -> str:
        """What a member whose hard budget is spent is told."""
        whose = "its" if self.budget.shared_by else "your"
        return (f"{self._used()}, so no GPU until {whose} budget renews on "
                f"{self._when()}. Start the server with 0 GPUs, or ask an admin.")

    def note(self) -> str:
        """What the spawn form says about her budget."""
        after = ("once they are spent, you get no GPU until they renew" if
                 self.budget.enforce == HARD else
                 "once they are spent, you wait behind members within theirs in line")
        return f"{self._used()} ({after}; they renew on {self._when()})."


def _hours(h: float) -> str:
    """101.2, 2.5, 0.0014: tenths, or two significant digits under one hour."""
    return f"{h:.1f}" if h >= 1 or h == 0 else f"{h:.2g}"


def budget_state(budget: Budget, used: float, now: float) -> BudgetState:
    return BudgetState(budget, used, next_reset(now, budget.per))


def budget_periods(config: GpusConfig) -> set[str]:
    """The periods (week, month) of every budget the file sets: the GPU-hours the line
    service must bring for them."""
    budgets = [config.default_budget, *(o.budget for o in (*config.groups, *config.users))]
    return {b.per for b in budgets if b is not None}
