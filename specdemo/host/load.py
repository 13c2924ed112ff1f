"""How loaded this host was while something was measured: the CPU time others took from it and the noise it left in
the measurement's own repeats.

    watch = start()                          # before the timed calls
    ...                                      # the timed calls
    load = since(watch, spread(repeats))     # after: a HostLoad
    load.busy()                              # "" when clean, else one sentence ("steal 18 %, load 2.9 on 2 cores")

Three signs, each cheap (two reads of /proc/stat and of this process's CPU time):

* steal: the share of the CPUs' time the hypervisor gave other guests (/proc/stat's steal column, its delta over the
  measurement): a VM's neighbours, invisible to everything else here;
* others: the share of the CPUs' time spent busy by anything but this process (the busy columns' delta less this
  process's own CPU time): a busy loop on one of 2 cores is 50 %. What "the load average beyond our own threads" means,
  taken over the measurement itself: the load average is a one-minute mean that counts our own inference threads and
  lags a measurement of seconds, so it is only reported;
* spread: how far the measurement's own repeats of one call disagree (measuring the same call twice on a quiet host
  gives the same time within a few %).

Off Linux (no /proc/stat) steal and others read 0, and the spread alone judges.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Sequence

# Above any of these, a host is busy. Measured on a 2-core Xeon VM (family 6 model 207) shared with other sessions:
# a quiet measurement read steal 0 %, others 1–9 %, repeats 8 % (quick) and 14 % (full) apart; one beside a busy
# loop on one core, steal 0–2 %, others 70–81 %, repeats 16 % (quick) and 38–42 % (full) apart.
STEAL_BUSY = 0.05  # the share of the CPUs' time stolen by the hypervisor
OTHERS_BUSY = 0.15  # others' share of the CPUs' time (a busy loop on one of 2 cores: 0.5)
SPREAD_BUSY = 0.20  # the repeats' relative spread ((slowest − fastest) ÷ fastest, the median over shapes)
WATCH_S = 5.0  # how long the host is watched, this process idle, before something is measured on it again
# The columns of /proc/stat's "cpu" line, in clock ticks: user nice system idle iowait irq softirq steal (guest and
# guest_nice follow, already counted in user and nice).
_IDLE, _IOWAIT, _STEAL = 3, 4, 7


@dataclass(frozen=True)
class Ticks:
    """One reading of the host's CPU time and this process's, from start() to since()."""

    total: float  # every CPU's time so far, seconds (/proc/stat's "cpu" line, its first 8 columns)
    idle: float  # of it idle or waiting on I/O
    steal: float  # of it given by the hypervisor to other guests
    own: float  # this process's CPU time so far (all its threads), seconds
    at: float  # time.monotonic()


@dataclass(frozen=True)
class HostLoad:
    """How loaded the host was over one measurement (shares are of every CPU's time over it, 0–1)."""

    seconds: float  # the measurement's wall time
    steal: float  # stolen by the hypervisor for other guests
    others: float  # busy, not for this process
    load_average: float  # the one-minute load average at its end (runnable threads, ours among them)
    cores: int  # the CPUs /proc/stat counts
    spread: float = 0.0  # the measurement's repeats: (slowest − fastest) ÷ fastest, the median over its shapes

    def busy(self) -> str:
        """Why the measurement is not to be trusted as this host's quiet costs, in one sentence; "" when clean."""
        if self.steal <= STEAL_BUSY and self.others <= OTHERS_BUSY and self.spread <= SPREAD_BUSY:
            return ""
        return (f"measured while the host was busy: steal {self.steal * 100:.0f} %, other processes "
                f"{self.others * 100:.0f} % of the CPU time, load {self.load_average:.1f} on {self.cores} cores, "
                f"repeats {self.spread * 100:.0f} % apart")

    def to_dict(self) -> dict:
        return asdict(self)


def judge(host: HostLoad) -> str:
    """host.busy(), unless SPECDEMO_HOST_LOAD=ignore: the tests set it, as their tiny models' sub-millisecond calls
    spread far apart on any host and a test must not hang on the machine's state (tests/host/test_host_load.py judges
    HostLoads of its own)."""
    return "" if os.environ.get("SPECDEMO_HOST_LOAD") == "ignore" else host.busy()


def parse_stat(text: str) -> tuple[float, float, float]:
    """(total, idle, steal) ticks of /proc/stat's first line ("cpu  user nice system idle iowait irq softirq steal
    …")."""
    columns = [float(x) for x in text.split("\n", 1)[0].split()[1:9]]
    columns += [0.0] * (8 - len(columns))  # old kernels have no steal column
    return sum(columns), columns[_IDLE] + columns[_IOWAIT], columns[_STEAL]


def read_stat() -> str:
    """/proc/stat's text ("" off Linux)."""
    try:
        with open("/proc/stat") as f:
            return f.read(4096)
    except OSError:
        return ""


def start(read: Callable[[], str] | None = None, own: Callable[[], float] = time.process_time) -> Ticks:
    """The reading a measurement starts from (`read`, `own`: the host's /proc/stat text, default read_stat, and this
    process's CPU seconds; tests give their own)."""
    text = (read or read_stat)()
    total, idle, steal = parse_stat(text) if text else (0.0, 0.0, 0.0)
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    return Ticks(total / tick, idle / tick, steal / tick, own(), time.monotonic())


def since(begun: Ticks, spread: float = 0.0, read: Callable[[], str] | None = None,
          own: Callable[[], float] = time.process_time,
          load_average: Callable[[], float] = lambda: os.getloadavg()[0], cores: int | None = None) -> HostLoad:
    """How loaded the host was since `begun` (start()), with the measurement's `spread` (see spread())."""
    now = start(read, own)
    total = now.total - begun.total
    if total <= 0:  # no /proc/stat, or too short a measurement to tell
        steal = others = 0.0
    else:
        busy = total - (now.idle - begun.idle) - (now.steal - begun.steal)
        steal = (now.steal - begun.steal) / total
        others = max(0.0, busy - (now.own - begun.own)) / total
    cores = cores or _cores(read or read_stat)
    return HostLoad(seconds=now.at - begun.at, steal=steal, others=min(others, 1.0), load_average=load_average(),
                    cores=cores, spread=spread)


def watch(seconds: float, sleep: Callable[[float], None] = time.sleep) -> HostLoad:
    """How loaded the host is while this process waits `seconds`: whether it is quiet enough to measure on now."""
    begun = start()
    sleep(seconds)
    return since(begun)


def busy_now(seconds: float) -> HostLoad | None:
    """The host watched for `seconds` (WATCH_S) while this process waits, where others still load it (judge); None
    where it is quiet. Asked before a busy measurement is taken again: a host still loaded would only give another busy
    take (beside a busy loop on one of 2 cores, three takes of every measurement made the background work 27 min)."""
    host = watch(seconds)
    return host if judge(host) else None


def described(host: HostLoad) -> str:
    """"other processes 80 % of the CPU time, steal 2 % over 5 s": a watch of the host, for people."""
    return (f"other processes {host.others * 100:.0f} % of the CPU time, steal {host.steal * 100:.0f} % over "
            f"{host.seconds:.0f} s")


def spread(repeats: Iterable[Sequence[float]]) -> float:
    """The relative spread of repeated timings: for each shape's repeats (seconds), (slowest − fastest) ÷ fastest,
    and the median over shapes (shapes timed once are left out; 0 when none was timed twice). The median, so one burst
    in one shape is not a busy host; a host loaded all along spreads every shape."""
    each = [(max(r) - min(r)) / min(r) for r in repeats if len(r) >= 2 and min(r) > 0]
    return statistics.median(each) if each else 0.0


def _cores(read: Callable[[], str]) -> int:
    """The CPUs /proc/stat lists ("cpu0", "cpu1", …), else os.cpu_count()."""
    listed = sum(1 for line in read().splitlines() if line.startswith("cpu") and line[3:4].isdigit())
    return listed or os.cpu_count() or 1
