"""How loaded the host was while a measurement ran (specdemo/host/load.py): read from fake /proc/stat texts."""

import subprocess
import sys

from specdemo.host import load


def stat(user, idle, steal, system=0, cpus=2):
    """A /proc/stat text in clock ticks: its "cpu" line and one line per CPU."""
    lines = [f"cpu  {user} 0 {system} {idle} 0 0 0 {steal} 0 0"]
    lines += [f"cpu{i} 0 0 0 0 0 0 0 0 0 0" for i in range(cpus)]
    return "\n".join(lines) + "\nintr 0\n"


def watched(before: str, after: str, own_before: float, own_after: float, spread: float = 0.0) -> load.HostLoad:
    """The HostLoad of a measurement between two /proc/stat texts, this process's CPU seconds going from own_before
    to own_after."""
    texts, owns = iter([before, after, after]), iter([own_before, own_after])
    begun = load.start(read=lambda: next(texts), own=lambda: next(owns))
    return load.since(begun, spread, read=lambda: next(texts), own=lambda: next(owns), load_average=lambda: 2.9)


def ticks(seconds: float) -> int:
    import os
    return int(seconds * os.sysconf("SC_CLK_TCK"))


def test_a_quiet_host_measured_by_its_own_threads_alone_is_clean():
    # 10 s on 2 cores: 20 CPU seconds, 19 of them ours, 1 idle
    host = watched(stat(0, 0, 0), stat(ticks(19), ticks(1), 0), own_before=5.0, own_after=24.0)
    assert host.others < 0.01 and host.steal == 0
    assert host.busy() == ""


def test_a_busy_loop_on_one_of_two_cores_is_other_processes_half_the_cpu_time():
    # 10 s on 2 cores: we ran 10 CPU seconds, someone else the other 10
    host = watched(stat(0, 0, 0), stat(ticks(20), 0, 0), own_before=0.0, own_after=10.0)
    assert abs(host.others - 0.5) < 0.01
    assert host.busy().startswith("measured while the host was busy:")
    assert "other processes 50 %" in host.busy() and "load 2.9 on 2 cores" in host.busy()


def test_stolen_time_makes_a_busy_host_and_is_said_as_steal():
    # 10 s on 2 cores: 18 % of the CPUs' time went to other guests
    host = watched(stat(0, 0, 0), stat(ticks(16.4), 0, ticks(3.6)), own_before=0.0, own_after=16.4)
    assert abs(host.steal - 0.18) < 0.01 and host.others < 0.01
    assert "steal 18 %" in host.busy()


def test_repeats_far_apart_make_a_busy_host_even_where_the_counters_are_quiet():
    quiet = stat(ticks(20), 0, 0)
    host = watched(stat(0, 0, 0), quiet, own_before=0.0, own_after=20.0, spread=load.spread([[1.0, 1.4], [2.0, 2.6]]))
    assert host.spread > load.SPREAD_BUSY and host.busy()


def test_spread_is_the_median_over_shapes_so_one_burst_is_not_a_busy_host():
    assert abs(load.spread([[1.0, 1.01], [2.0, 2.02], [3.0, 6.0]]) - 0.01) < 1e-9
    assert load.spread([[1.0]]) == 0.0


def test_without_proc_stat_only_the_spread_judges():
    host = load.since(load.start(read=lambda: ""), 0.05, read=lambda: "", load_average=lambda: 0.5, cores=2)
    assert host.steal == host.others == 0 and host.busy() == ""


def test_watching_the_host_while_this_process_waits_counts_every_busy_tick_as_others():
    """What a page watches before it measures again: a busy loop in another process, over the wait, is others' time."""
    spin = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 3: pass"])
    try:
        host = load.watch(1.0)
    finally:
        spin.wait()
    assert host.seconds >= 1.0 and host.others >= 0.25  # one core of this host's busy: ~50 % of the CPU time
    assert host.busy().startswith("measured while the host was busy")
